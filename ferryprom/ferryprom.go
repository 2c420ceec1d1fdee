// Package ferryprom records Ferry's metrics with Prometheus. It is a
// ferry.MetricsHook: give it to the relay, the consumer, RunTx and
// AwaitSettled, and register nothing else.
//
//	prom := ferryprom.New(prometheus.DefaultRegisterer)
//	relay, _ := ferry.NewRelay(drv, sink, &ferry.RelayConfig{Hooks: []ferry.Hook{prom}})
//	billing, _ := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Hooks: []ferry.Hook{prom}})
//	res, err := ferry.RunTx(ctx, drv, &ferry.TxOptions{Hooks: []ferry.Hook{prom}}, placeOrder)
//	st, err := ferry.AwaitSettled(ctx, drv, "billing", ids, 2*time.Second, prom)
//
// The metrics keep the names, help texts and labels documented in the
// README (ferry_relay_*, ferry_consumer_*, ferry_tx_*,
// ferry_settlement_wait_seconds). Only importers of this package depend on
// the Prometheus client: the root package does not.
package ferryprom

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferry-dev/ferry"
)

// Hook registers Ferry's metrics with a Prometheus registerer as the
// runtime asks for them (ferry.MetricsHook). It is safe for concurrent
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

var _ ferry.MetricsHook = (*Hook)(nil)

// Instrument returns the collector of d, registering it the first time.
// The same description (name and constant labels) gets the same collector,
// from this Hook or from another registering with the same registerer.
func (h *Hook) Instrument(d *ferry.MetricDesc) (ferry.Instrument, error) {
	key := ferry.MetricKey(d)
	h.mu.Lock()
	defer h.mu.Unlock()
	if in, ok := h.made[key]; ok {
		return in, nil
	}
	in := &instrument{}
	var c prometheus.Collector
	switch d.Kind {
	case ferry.Counter:
		in.counter = prometheus.NewCounterVec(prometheus.CounterOpts{Name: d.Name, Help: d.Help, ConstLabels: d.ConstLabels}, d.Labels)
		c = in.counter
	case ferry.Gauge:
		in.gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: d.Name, Help: d.Help, ConstLabels: d.ConstLabels}, d.Labels)
		c = in.gauge
	case ferry.Histogram:
		in.histogram = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: d.Name, Help: d.Help, ConstLabels: d.ConstLabels, Buckets: d.Buckets}, d.Labels)
		c = in.histogram
	default:
		return nil, fmt.Errorf("ferryprom: metric %s has an unknown kind %d", d.Name, d.Kind)
	}
	if err := h.reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("ferryprom: register %s: %w", d.Name, err)
		}
		if !in.adopt(are.ExistingCollector) {
			return nil, fmt.Errorf("ferryprom: register %s: another collector of another kind has the name", d.Name)
		}
	}
	if len(d.Labels) == 0 {
		in.touch() // a metric without labels shows from the start, at 0
	}
	h.made[key] = in
	return in, nil
}

// touch creates the series of a metric without labels.
func (in *instrument) touch() {
	switch {
	case in.counter != nil:
		in.counter.WithLabelValues()
	case in.gauge != nil:
		in.gauge.WithLabelValues()
	case in.histogram != nil:
		in.histogram.WithLabelValues()
	}
}

// instrument is one metric vector; the field of its kind is set.
type instrument struct {
	counter   *prometheus.CounterVec
	gauge     *prometheus.GaugeVec
	histogram *prometheus.HistogramVec
}

// adopt makes in use c, the collector registered first under the name.
func (in *instrument) adopt(c prometheus.Collector) bool {
	switch {
	case in.counter != nil:
		in.counter, _ = c.(*prometheus.CounterVec)
		return in.counter != nil
	case in.gauge != nil:
		in.gauge, _ = c.(*prometheus.GaugeVec)
		return in.gauge != nil
	default:
		in.histogram, _ = c.(*prometheus.HistogramVec)
		return in.histogram != nil
	}
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

func (in *instrument) Reset() {
	switch {
	case in.counter != nil:
		in.counter.Reset()
	case in.gauge != nil:
		in.gauge.Reset()
	case in.histogram != nil:
		in.histogram.Reset()
	}
}
