// Package ferrypromtest reads what a Prometheus registry holds, for tests of
// the metrics Ferry records through ferryprom.
package ferrypromtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// Value sums, over the series of metric name whose labels include want, a
// counter's or gauge's value, or a histogram's number of observations. ok
// is false when the registry has no such series.
func Value(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) (v float64, ok bool) {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, w := range want {
				if got[k] != w {
					continue series
				}
			}
			ok = true
			switch {
			case m.Counter != nil:
				v += m.GetCounter().GetValue()
			case m.Gauge != nil:
				v += m.GetGauge().GetValue()
			case m.Histogram != nil:
				v += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return v, ok
}
