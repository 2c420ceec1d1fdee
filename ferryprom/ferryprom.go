// Package ferryprom records Ferry's metrics with Prometheus. It is a
// ferryhook.MetricsHook: give it to the relay, the consumer, RunTx and
// AwaitSettled, and register nothing else.
//
//	prom := ferryprom.New(prometheus.DefaultRegisterer)
//	relay, _ := ferry.NewRelay(drv, sink, &ferry.RelayConfig{Hooks: []ferryhook.Hook{prom}})
//	billing, _ := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Hooks: []ferryhook.Hook{prom}})
//	res, err := ferry.RunTx(ctx, drv, &ferry.TxOptions{Hooks: []ferryhook.Hook{prom}}, placeOrder)
//	st, err := ferry.AwaitSettled(ctx, drv, "billing", ids, 2*time.Second, prom)
//
// The metrics keep the names, help texts and labels documented in the
// guide, docs/observability.md (ferry_relay_*, ferry_consumer_*, ferry_tx_*,
// ferry_settlement_wait_seconds). Only importers of this package depend on
// the Prometheus client: the root package does not.
package ferryprom

import (
	"errors"
	"fmt"
	"sync"

	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/prometheus/client_golang/prometheus"
)

// Hook registers Ferry's metrics with a Prometheus registerer as the
// runtime asks for them (ferryhook.MetricsHook). It is safe for concurrent
// use.
type Hook struct {
	reg  prometheus.Registerer
	mu   sync.Mutex
	made map[string]*instrument
}

// New returns a Hook registering with reg (prometheus.DefaultRegisterer
// when nil).
func New(reg prometheus.Registerer) *Hook {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	return &Hook{reg: reg, made: map[string]*instrument{}}
}

var _ ferryhook.MetricsHook = (*Hook)(nil)

// Instrument returns the collector of d, registering it the first time.
// The same description (name and constant labels) gets the same collector,
// from this Hook or from another registering with the same registerer.
func (h *Hook) Instrument(d *ferryhook.MetricDesc) (ferryhook.Instrument, error) {
	key := ferryhook.MetricKey(d)
	h.mu.Lock()
	defer h.mu.Unlock()
	if in, ok := h.made[key]; ok {
		return in, nil
	}
	var c prometheus.Collector
	switch d.Kind {
	case ferryhook.Counter:
		c = prometheus.NewCounterVec(prometheus.CounterOpts{Name: d.Name, Help: d.Help, ConstLabels: d.ConstLabels}, d.Labels)
	case ferryhook.Gauge:
		c = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: d.Name, Help: d.Help, ConstLabels: d.ConstLabels}, d.Labels)
	case ferryhook.Histogram:
		c = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: d.Name, Help: d.Help, ConstLabels: d.ConstLabels, Buckets: d.Buckets}, d.Labels)
	default:
		return nil, fmt.Errorf("ferryprom: metric %s has an unknown kind %d", d.Name, d.Kind)
	}
	if err := h.reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("ferryprom: register %s: %w", d.Name, err)
		}
		c = are.ExistingCollector // registered first, by another Hook
	}
	in := instrumentOf(c, d.Kind)
	if in == nil {
		return nil, fmt.Errorf("ferryprom: register %s: a collector of another kind has the name", d.Name)
	}
	if len(d.Labels) == 0 {
		// A metric without labels shows from the start, at 0.
		if _, err := in.vec.GetMetricWithLabelValues(); err != nil {
			return nil, fmt.Errorf("ferryprom: %s: %w", d.Name, err)
		}
	}
	h.made[key] = in
	return in, nil
}

// instrument is one metric vector: vec, and the field of its kind.
type instrument struct {
	vec       *prometheus.MetricVec
	counter   *prometheus.CounterVec
	gauge     *prometheus.GaugeVec
	histogram *prometheus.HistogramVec
}

// instrumentOf returns the instrument of c, nil when c is not a vector of
// that kind.
func instrumentOf(c prometheus.Collector, kind ferryhook.MetricKind) *instrument {
	switch c := c.(type) {
	case *prometheus.CounterVec:
		if kind == ferryhook.Counter {
			return &instrument{vec: c.MetricVec, counter: c}
		}
	case *prometheus.GaugeVec:
		if kind == ferryhook.Gauge {
			return &instrument{vec: c.MetricVec, gauge: c}
		}
	case *prometheus.HistogramVec:
		if kind == ferryhook.Histogram {
			return &instrument{vec: c.MetricVec, histogram: c}
		}
	}
	return nil
}

func (in *instrument) Add(v float64, lv ...string) {
	if in.counter != nil {
		in.counter.WithLabelValues(lv...).Add(v)
	}
}

func (in *instrument) Set(v float64, lv ...string) {
	if in.gauge != nil {
		in.gauge.WithLabelValues(lv...).Set(v)
	}
}

func (in *instrument) Observe(v float64, lv ...string) {
	if in.histogram != nil {
		in.histogram.WithLabelValues(lv...).Observe(v)
	}
}

func (in *instrument) Reset() { in.vec.Reset() }
