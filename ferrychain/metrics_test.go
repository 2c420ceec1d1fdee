package ferrychain_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrychain"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/ferry-dev/ferry/ferryprom/ferrypromtest"
)

// TestMetricsGoThroughTheHooks: the source records its ferry_chain_*
// metrics through the MetricsHook in Config.Hooks, and its deliveries
// reach the inbox's metric as system "evm". Blocks 1-3 carry a, b, c; the
// chain forks at block 1 (b and c orphaned, then re-mined) and the new
// branch carries d: one reorg of depth 2, two events retracted, six
// ingested.
func TestMetricsGoThroughTheHooks(t *testing.T) {
	t.Parallel()
	c := newChain(t)
	drv := newDriver(t)
	reg := prometheus.NewRegistry()
	prom := ferryprom.New(reg)
	g := newGroup(t, drv, "metered", prom)
	stop := runSource(t, drv, g, c, ferrychain.Latest, nil, prom)
	defer stop()

	for _, note := range []string{"a", "b", "c"} {
		c.note(0, note)
		c.commit()
	}
	waitCursor(t, drv, g, c, 3)
	require.NoError(t, c.backend.Fork(c.header(1).Hash()))
	c.note(1, "d")
	c.commit()  // 2'
	c.commit()  // 3'
	c.commit()  // 4': longer, canonical
	c.mineAll() // b and c come back from the mempool
	head := c.head()
	waitCursor(t, drv, g, c, head)
	g.settle(t)
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		if labels == nil {
			labels = map[string]string{}
		}
		labels["group"] = "metered"
		v, ok := ferrypromtest.Value(t, reg, name, labels)
		require.True(t, ok, "%s %v is not recorded", name, labels)
		return v
	}
	// The lag is measured when the head is read: the read after the
	// cursor reached it finds none.
	require.Eventually(t, func() bool { return value("ferry_chain_head_lag_blocks", nil) == 0 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}, g.net(t))

	require.Equal(t, float64(head), value("ferry_chain_head_block", nil))
	require.Equal(t, float64(head), value("ferry_chain_cursor_block", nil))
	require.Equal(t, 1.0, value("ferry_chain_reorgs_total", nil))
	require.Equal(t, 1.0, value("ferry_chain_reorg_depth_blocks", nil), "one reorg depth observed")
	require.Equal(t, 2.0, value("ferry_chain_retracted_events_total", nil), "b's and c's orphaned events")
	require.Equal(t, 6.0, value("ferry_chain_ingested_events_total", nil), "a, b, c, then d and the re-mined b and c")
	value("ferry_chain_rpc_errors_total", nil) // recorded from the start, at 0 unless the node failed a call
	require.Equal(t, 6.0, value("ferry_consumer_ingested_events_total", map[string]string{"system": ferrychain.System, "result": "inserted"}),
		"the inbox counts the source's deliveries under its system")
}
