package ferry

import (
	"context"
	"time"
)

// Hook observes Ferry's runtime, for tracing, metrics or logs, without the
// root module depending on any telemetry stack: a hook is any value that
// implements one or more of EmitHook (Config.Hooks), PublishHook
// (RelayConfig.Hooks), IngestHook (ConsumerConfig.Hooks), TxHook
// (TxOptions.Hooks), SettleHook (AwaitSettled's trailing hooks) and
// MetricsHook (all of them). A Client, a Relay, a Consumer, RunTx or
// AwaitSettled given hooks calls, on each, the methods it implements that
// concern it. Hooks are called from many goroutines at once and on Ferry's
// own paths: they must be safe for concurrent use and must not block.
// Package ferryotel is a hook for OpenTelemetry, ferryprom a MetricsHook
// for Prometheus.
type Hook any

// DefaultSystem is the messaging system that telemetry names when nothing
// names another: Ferry itself, the transport of the relay's inbox sink
// (Consumer.Sink) and of an Ingest whose context names none.
const DefaultSystem = "ferry"

// EmitHook is called by Emit and EmitTx for each event, with the caller's
// context, after its ID is filled in and before it is validated: it may add
// headers. A tracing hook writes the trace context of ctx there
// (traceparent, tracestate), so that the event carries it to every sink,
// every inbox and every handler.
type EmitHook interface {
	OnEmit(ctx context.Context, ev *Event)
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
	Event *Event
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
	Events []*Event
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
// inbox (ConsumerConfig.Hooks).
type IngestHook interface {
	OnIngest(info *IngestInfo)
}

// Middleware wraps every handler call of a consumer, for tracing, logging,
// metrics or code of your own (ConsumerConfig.Middleware). evs are the
// events the call applies: one, or for a batch handler (HandleBatch) a
// batch's events of one type. call runs the handler with the context it is
// given; a middleware calls it at most once, usually with ctx or a context
// derived from it, and returns its error (or one of its own, which fails
// the call like a handler error). The call runs inside the handler's
// transaction: a middleware that writes elsewhere should not count on it
// committing. ConsumerGroup(ctx) names the consumer's group.
type Middleware func(ctx context.Context, evs []*Event, call func(ctx context.Context) error) error

type (
	groupKey struct{}
	eventKey struct{}
)

// EventFromContext returns the event a handler call or a log record is
// about: the handler's ctx carries it (for a batch handler's call, nil),
// and so does the context of the consumer's and the relay's log records
// about one event (a failed attempt, a dead event, a dead letter, a held
// key), so that a log handler can add the event's trace (ferryotel's
// LogHandler does). Nil when there is none.
func EventFromContext(ctx context.Context) *Event {
	ev, _ := ctx.Value(eventKey{}).(*Event)
	return ev
}

// withEvent returns ctx carrying ev (EventFromContext).
func withEvent(ctx context.Context, ev *Event) context.Context {
	return context.WithValue(ctx, eventKey{}, ev)
}

// ConsumerGroup returns the consumer group whose handler call ctx belongs
// to ("" outside one): for middleware and handlers that label what they
// record by group.
func ConsumerGroup(ctx context.Context) string {
	g, _ := ctx.Value(groupKey{}).(string)
	return g
}

// chain returns call wrapped in mws, the first outermost.
func chain(mws []Middleware, evs []*Event, call func(ctx context.Context) error) func(ctx context.Context) error {
	for i := len(mws) - 1; i >= 0; i-- {
		mw, next := mws[i], call
		call = func(ctx context.Context) error { return mw(ctx, evs, next) }
	}
	return call
}

// hooksOf returns the hooks among hooks that implement T.
func hooksOf[T any](hooks []Hook) []T {
	var out []T
	for _, h := range hooks {
		if th, ok := h.(T); ok {
			out = append(out, th)
		}
	}
	return out
}
