// Package ferryhook is how telemetry observes Ferry: the hooks a Client,
// a Relay, a Consumer and RunTx call (EmitHook, PublishHook, IngestHook,
// TxHook) and the metrics they record through a MetricsHook. Package
// ferryotel implements them for OpenTelemetry, ferryprom MetricsHook for
// Prometheus; the root package only calls them, so it depends on no
// telemetry stack.
package ferryhook

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Hook observes Ferry's runtime, for tracing, metrics or logs, without the
// root module depending on any telemetry stack: a hook is any value that
// implements one or more of EmitHook (ferry.Config.Hooks), PublishHook
// (ferry.RelayConfig.Hooks), IngestHook (ferry.ConsumerConfig.Hooks), TxHook
// (ferry.TxOptions.Hooks), ferry.SettleHook (ferry.AwaitSettled's trailing
// hooks) and MetricsHook (all of them). A Client, a Relay, a Consumer, RunTx
// or AwaitSettled given hooks calls, on each, the methods it implements that
// concern it. Hooks are called from many goroutines at once and on Ferry's
// own paths: they must be safe for concurrent use and must not block.
// Package ferryotel is a hook for OpenTelemetry, ferryprom a MetricsHook
// for Prometheus.
type Hook any

// EmitHook is called by Emit and EmitTx for each event, with the caller's
// context, after its ID is filled in and before it is validated: it may add
// headers. A tracing hook writes the trace context of ctx there
// (traceparent, tracestate), so that the event carries it to every sink,
// every inbox and every handler.
type EmitHook interface {
	OnEmit(ctx context.Context, ev *ferryevent.Event)
}

// PublishInfo describes one event a relay handed to its sink, once the
// sink answered for it.
type PublishInfo struct {
	// Feed is the relay's feed and partition ("default/0").
	Feed string
	// System names the destination's kind when the sink says
	// (ferrysink.Describer): "nats", "kafka", "rabbitmq", "webhook".
	System string
	// Event is the event published. Read it, do not change it.
	Event *ferryevent.Event
	// Start is when the event was handed to the sink; the answer came
	// just before the hook was called.
	Start time.Time
	// Err is the sink's answer for the event: nil when the destination
	// acknowledged it. A failed event is published again (or parked, or
	// dead-lettered) and reported again each time.
	Err error
}

// PublishHook is called by the relay for every event it publishes, each
// time the sink answers for it.
type PublishHook interface {
	OnPublish(info *PublishInfo)
}

// IngestInfo describes one delivery a consumer put in its inbox: a
// source's batch (Consumer.Consume), a call of Consumer.Ingest, or a
// relay's call of the consumer's sink.
type IngestInfo struct {
	// Group is the consumer's group.
	Group string
	// System names the transport the events came through, as the
	// ingest's context says (ferrysink.WithSystem): the broker of a source
	// run by Consume that is a ferrysink.Describer ("nats", "kafka",
	// "rabbitmq"), "webhook" from ferrywebhook.Handler, "evm" from
	// ferrychain, "ferry" (DefaultSystem) from the relay's inbox sink and
	// when the context names none.
	System string
	// Events are the events delivered. Read them, do not change them.
	Events []*ferryevent.Event
	// Inserted is how many were new to the inbox; the others were
	// redeliveries of events it already had.
	Inserted int
	// Start is when the insert began; it ended just before the hook was
	// called.
	Start time.Time
	// Err is the insert's error: nil when the events are in the inbox
	// (and the source may acknowledge them).
	Err error
}

// IngestHook is called by a consumer for every delivery it puts in its
// inbox (ferry.ConsumerConfig.Hooks).
type IngestHook interface {
	OnIngest(info *IngestInfo)
}

// TxHook observes ferry.RunTx calls (ferry.TxOptions.Hooks).
type TxHook interface {
	// OnTxStart is called when a RunTx call starts. The context it returns
	// is the one the attempts run in (a tracing hook puts the call's span
	// there, so that the callback's own spans are its children); the
	// TxObserver hears of the call's retries and of its end.
	OnTxStart(ctx context.Context, requestID string) (context.Context, TxObserver)
}

// TxObserver hears of one RunTx call's retries and of its end.
type TxObserver interface {
	// OnRetry is called before an attempt runs again: attempt is the one
	// that failed, cause why it may rerun ("serialization_failure",
	// "deadlock", "rerun_requested", "commit_aborted", ...), err its error.
	OnRetry(attempt int, cause string, err error)
	// OnEnd is called once, when RunTx returns: attempts is how many ran,
	// err what RunTx returns (nil when it committed).
	OnEnd(attempts int, err error)
}

// DefaultSystem is the messaging system that telemetry names when nothing
// names another: Ferry itself, the transport of the relay's inbox sink
// (ferry.Consumer.Sink) and of an Ingest whose context names none.
const DefaultSystem = "ferry"

// MetricKind says how a metric is recorded.
type MetricKind int

// The kinds of metrics.
const (
	// Counter only grows: Add.
	Counter MetricKind = iota + 1
	// Gauge is set to a value: Set.
	Gauge
	// Histogram counts observations in buckets: Observe.
	Histogram
)

// MetricDesc describes one of Ferry's metrics. The names, help texts and
// labels are Ferry's documented metrics (docs/observability.md, "Metrics"); a
// MetricsHook records them under those names.
type MetricDesc struct {
	// Name is the full name, for example "ferry_relay_events_published_total".
	Name string
	Help string
	Kind MetricKind
	// ConstLabels hold the labels the instrument always has, for example
	// {"feed": "default/0"} or {"group": "billing"}.
	ConstLabels map[string]string
	// Labels name the labels whose values each recording gives, in order.
	Labels []string
	// Buckets are a histogram's upper bounds, ascending.
	Buckets []float64
}

// Instrument records one metric. Only the method of its kind is called;
// labelValues are the values of MetricDesc.Labels, in order. It must be
// safe for concurrent use.
type Instrument interface {
	Add(v float64, labelValues ...string)
	Set(v float64, labelValues ...string)
	Observe(v float64, labelValues ...string)
	// Reset drops every series of the metric (a gauge another process
	// now reports).
	Reset()
}

// MetricsHook is a Hook that records Ferry's metrics. The relay, the
// consumer, RunTx and AwaitSettled ask it for an Instrument per metric
// they record: the relay and the consumer when they are made (an error
// then fails NewRelay or NewConsumer, for example a metric registered
// twice), RunTx and AwaitSettled on each call (the hook should return the
// same instrument for the same description). Package ferryprom records
// them with Prometheus.
type MetricsHook interface {
	Instrument(d *MetricDesc) (Instrument, error)
}

// NewInstrument returns an Instrument recording d with every MetricsHook
// among hooks (a no-op one when there is none): the relay and the consumer
// make theirs with it, and so can code outside this package that reports
// through the same hooks, as ferrychain does.
func NewInstrument(hooks []Hook, d *MetricDesc) (Instrument, error) {
	var out multiInstrument
	for _, mh := range Of[MetricsHook](hooks) {
		in, err := mh.Instrument(d)
		if err != nil {
			return nil, fmt.Errorf("metric %s: %w", d.Name, err)
		}
		out = append(out, in)
	}
	return out, nil
}

type multiInstrument []Instrument

func (m multiInstrument) Add(v float64, lv ...string) {
	for _, in := range m {
		in.Add(v, lv...)
	}
}

func (m multiInstrument) Set(v float64, lv ...string) {
	for _, in := range m {
		in.Set(v, lv...)
	}
}

func (m multiInstrument) Observe(v float64, lv ...string) {
	for _, in := range m {
		in.Observe(v, lv...)
	}
}

func (m multiInstrument) Reset() {
	for _, in := range m {
		in.Reset()
	}
}

// MetricKey identifies a metric's instrument among others of the same
// name: its name and constant labels. MetricsHook implementations use it
// to return the same instrument for the same description.
func MetricKey(d *MetricDesc) string {
	keys := make([]string, 0, len(d.ConstLabels))
	for k := range d.ConstLabels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(d.Name)
	for _, k := range keys {
		b.WriteString("\x00" + k + "=" + d.ConstLabels[k])
	}
	return b.String()
}

// Of returns the hooks among hooks that implement T.
func Of[T any](hooks []Hook) []T {
	var out []T
	for _, h := range hooks {
		if th, ok := h.(T); ok {
			out = append(out, th)
		}
	}
	return out
}
