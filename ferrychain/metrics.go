package ferrychain

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	head, cursor, lag           prometheus.Gauge
	reorgs, retracted, ingested prometheus.Counter
	rpcErrors                   prometheus.Counter
	reorgDepth                  prometheus.Observer
}

func newMetrics(reg prometheus.Registerer, group string) (*metrics, error) {
	labels := prometheus.Labels{"group": group}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Subsystem: "chain", Name: name, Help: help, ConstLabels: labels})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Subsystem: "chain", Name: name, Help: help, ConstLabels: labels})
	}
	depth := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "ferry", Subsystem: "chain", Name: "reorg_depth_blocks",
		Help: "Depth of the reorgs seen, in blocks.", ConstLabels: labels, Buckets: []float64{1, 2, 3, 5, 8, 13, 32, 64, 128}})
	m := &metrics{
		head:       gauge("head_block", "Latest head block number seen."),
		cursor:     gauge("cursor_block", "Last block whose logs reached the inbox."),
		lag:        gauge("head_lag_blocks", "Blocks between the head and the cursor."),
		reorgs:     counter("reorgs_total", "Reorgs that replaced blocks the cursor had passed."),
		retracted:  counter("retracted_events_total", "Events retracted because their block was orphaned."),
		ingested:   counter("ingested_events_total", "Events put in the inbox."),
		rpcErrors:  counter("rpc_errors_total", "Failed node calls (the source retries)."),
		reorgDepth: depth,
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.head, m.cursor, m.lag, m.reorgs, m.retracted, m.ingested, m.rpcErrors, depth} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
			}
		}
	}
	return m, nil
}
