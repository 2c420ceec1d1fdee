package ferryprom_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
)

func TestInstrumentsKeepFerrysNamesAndShareCollectors(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	h := ferryprom.New(reg)
	retries := &ferryhook.MetricDesc{Name: "ferry_relay_publish_retries_total", Help: "h", Kind: ferryhook.Counter, ConstLabels: map[string]string{"feed": "default/0"}}
	in, err := h.Instrument(retries)
	require.NoError(t, err)
	require.Equal(t, 1, testutil.CollectAndCount(reg, "ferry_relay_publish_retries_total"), "a metric without labels shows at 0 from the start")
	again, err := h.Instrument(retries)
	require.NoError(t, err)
	in.Add(2)
	again.Add(1)
	require.InDelta(t, 3, testutil.ToFloat64(mustGather(t, reg, "ferry_relay_publish_retries_total")), 0, "the same description gets the same collector")

	other, err := ferryprom.New(reg).Instrument(retries)
	require.NoError(t, err, "another hook on the same registry adopts the registered collector")
	other.Add(1)
	require.InDelta(t, 4, testutil.ToFloat64(mustGather(t, reg, "ferry_relay_publish_retries_total")), 0)

	states, err := h.Instrument(&ferryhook.MetricDesc{Name: "ferry_consumer_inbox_rows", Help: "h", Kind: ferryhook.Gauge, Labels: []string{"state"}})
	require.NoError(t, err)
	states.Set(5, "pending")
	states.Set(1, "dead")
	require.Equal(t, 2, testutil.CollectAndCount(reg, "ferry_consumer_inbox_rows"))
	states.Reset()
	require.Equal(t, 0, testutil.CollectAndCount(reg, "ferry_consumer_inbox_rows"))

	wait, err := h.Instrument(&ferryhook.MetricDesc{Name: "ferry_settlement_wait_seconds", Help: "h", Kind: ferryhook.Histogram, Labels: []string{"outcome"}, Buckets: []float64{0.1, 1}})
	require.NoError(t, err)
	wait.Observe(0.5, "settled")
	require.Equal(t, 1, testutil.CollectAndCount(reg, "ferry_settlement_wait_seconds"))

	_, err = ferryprom.New(reg).Instrument(&ferryhook.MetricDesc{Name: "ferry_relay_publish_retries_total", Help: "h", Kind: ferryhook.Gauge, ConstLabels: map[string]string{"feed": "default/0"}})
	require.ErrorContains(t, err, "another kind", "a name registered as a counter is not adopted as a gauge")

	_, err = h.Instrument(&ferryhook.MetricDesc{Name: "ferry_x", Kind: ferryhook.MetricKind(9)})
	require.ErrorContains(t, err, "unknown kind")
}

// mustGather returns the collector-like view testutil.ToFloat64 reads: the
// registry filtered to one metric.
func mustGather(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			require.Len(t, mf.Metric, 1)
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x", Help: "x"}, func() float64 { return mf.Metric[0].GetCounter().GetValue() })
		}
	}
	t.Fatalf("metric %s is not gathered", name)
	return nil
}

// TestRootPackageNeedsNoTelemetryStack: importing github.com/ferry-dev/ferry
// pulls in neither Prometheus nor OpenTelemetry; the plug-ins do.
func TestRootPackageNeedsNoTelemetryStack(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/ferry-dev/ferry").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for dep := range strings.SplitSeq(string(out), "\n") {
		require.False(t, strings.Contains(dep, "prometheus") || strings.Contains(dep, "opentelemetry"), "the root package depends on %s", dep)
	}
	out, err = exec.Command("go", "list", "-deps", "github.com/ferry-dev/ferry/ferryprom").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "github.com/prometheus/client_golang/prometheus\n", "the check can see a dependency")
}
