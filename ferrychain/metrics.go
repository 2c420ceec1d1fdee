package ferrychain

import (
	"errors"
	"fmt"

	"github.com/ferry-dev/ferry/ferryhook"
)

type (
	gauge    struct{ in ferryhook.Instrument }
	counter  struct{ in ferryhook.Instrument }
	observer struct{ in ferryhook.Instrument }
)

func (g gauge) Set(v float64)        { g.in.Set(v) }
func (c counter) Inc()               { c.in.Add(1) }
func (c counter) Add(v float64)      { c.in.Add(v) }
func (o observer) Observe(v float64) { o.in.Observe(v) }

type metrics struct {
	head, cursor, lag           gauge
	reorgs, retracted, ingested counter
	rpcErrors                   counter
	reorgDepth                  observer
}

// newMetrics makes the source's metrics, labelled by group, with the
// ferry.MetricsHooks among hooks (ferryprom.New(registerer) for
// Prometheus).
func newMetrics(hooks []ferryhook.Hook, group string) (*metrics, error) {
	labels := map[string]string{"group": group}
	var errs []error
	make := func(name, help string, kind ferryhook.MetricKind, buckets []float64) ferryhook.Instrument {
		in, err := ferryhook.NewInstrument(hooks, &ferryhook.MetricDesc{Name: "ferry_chain_" + name, Help: help, Kind: kind, ConstLabels: labels, Buckets: buckets})
		if err != nil {
			errs = append(errs, err)
		}
		return in
	}
	g := func(name, help string) gauge { return gauge{make(name, help, ferryhook.Gauge, nil)} }
	c := func(name, help string) counter { return counter{make(name, help, ferryhook.Counter, nil)} }
	m := &metrics{
		head:       g("head_block", "Latest head block number seen."),
		cursor:     g("cursor_block", "Last block whose logs reached the inbox."),
		lag:        g("head_lag_blocks", "Blocks between the head and the cursor."),
		reorgs:     c("reorgs_total", "Reorgs that replaced blocks the cursor had passed."),
		retracted:  c("retracted_events_total", "Events retracted because their block was orphaned."),
		ingested:   c("ingested_events_total", "Events put in the inbox."),
		rpcErrors:  c("rpc_errors_total", "Failed node calls (the source retries)."),
		reorgDepth: observer{make("reorg_depth_blocks", "Depth of the reorgs seen, in blocks.", ferryhook.Histogram, []float64{1, 2, 3, 5, 8, 13, 32, 64, 128})},
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("ferrychain: metrics for group %s: %w", group, err)
	}
	return m, nil
}
