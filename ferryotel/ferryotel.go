// Package ferryotel traces Ferry with OpenTelemetry, from the request that
// emits an event to every handler that applies it.
//
// One Tracer is a hook (ferryhook.Hook) for every place an event passes, and
// makes the consumer's middleware:
//
//	tr := ferryotel.New() // the global TracerProvider and W3C Trace Context
//	client, _ := ferry.NewClient(drv, &ferry.Config{Hooks: []ferryhook.Hook{tr}})
//	relay, _ := ferry.NewRelay(drv, sink, &ferry.RelayConfig{Hooks: []ferryhook.Hook{tr}})
//	consumer, _ := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing",
//		Hooks: []ferryhook.Hook{tr}, Middleware: []ferry.Middleware{tr.Middleware()}})
//	res, err := ferry.RunTx(ctx, drv, &ferry.TxOptions{Hooks: []ferryhook.Hook{tr}}, placeOrder)
//	st, err := ferry.AwaitSettled(ctx, drv, "billing", ids, 2*time.Second, tr)
//
// What it records:
//
//   - Emit and EmitTx write the trace context of their ctx (the request's
//     span) into each event's headers, traceparent and tracestate, unless
//     the event has a traceparent of its own (ferryhook.EmitHook). The headers
//     are stored in the outbox and carried by every sink, source and inbox.
//   - The relay records a "send <topic>" span (kind producer) for each
//     event it publishes, from the hand-off to the sink's answer, as a
//     child of the event's trace context (ferryhook.PublishHook).
//   - The consumer records a "receive <topic>" span (kind consumer) for
//     each delivery it puts in its inbox, from a source, a webhook
//     receiver, ferrychain or the relay's inbox sink (ferryhook.IngestHook):
//     for one event, a child of the event's trace context; for several,
//     linked to each event's context.
//   - The consumer runs each handler call in a "process <topic>" span (kind
//     consumer, Middleware): for one event, a child of the event's trace
//     context, with a link to it too; for a batch handler's call, a span
//     linked to each event's context. Spans the handler starts from its
//     ctx are children of it.
//   - RunTx is one "RunTx" span with a "retry" event per rerun
//     (ferryhook.TxHook); AwaitSettled one "AwaitSettled" span with the outcome
//     (ferry.SettleHook).
//   - LogHandler puts trace_id and span_id into log records.
//
// The attributes follow the OpenTelemetry messaging semantic conventions:
// messaging.system, messaging.destination.name (the topic),
// messaging.message.id (the event ID), messaging.operation.type ("send",
// "receive", "process"), messaging.consumer.group.name,
// messaging.batch.message_count, plus ferry.key and ferry.feed. A failed
// publish, delivery or handler call records the error and sets the span's
// status.
//
// messaging.system names the transport each span is about. A send span
// names the sink's destination ("nats", "kafka", "rabbitmq", "webhook":
// ferrysink.Describer), a receive span the transport the delivery came
// through (ferryhook.IngestInfo.System: the same names from their sources and
// the webhook receiver, "evm" from ferrychain). Both say "ferry" for the
// direct path, where the relay writes into the inbox itself
// (Consumer.Sink). A process span always says "ferry": the handler reads
// the event from the consumer's inbox, a table of Ferry's, not from the
// broker, which the event left when its receive span ended (a redelivery,
// a retry or a rescue runs from the inbox too); the receive span of the
// same trace tells where it came from.
//
// The root module does not depend on OpenTelemetry: import this package
// only where you want it.
package ferryotel

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryhook"
)

// ScopeName is the instrumentation scope of Ferry's spans.
const ScopeName = "github.com/ferry-dev/ferry/ferryotel"

// Tracer records Ferry's spans and carries trace context in events. It is
// a ferryhook.EmitHook, PublishHook, IngestHook, TxHook and SettleHook, and
// makes consumer middleware (Middleware) and log handlers (LogHandler); it
// is safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// Option configures a Tracer.
type Option func(*options)

type options struct {
	tp   trace.TracerProvider
	prop propagation.TextMapPropagator
}

// WithTracerProvider makes the Tracer record its spans with tp instead of
// the global provider (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tp = tp }
}

// WithPropagator makes the Tracer carry trace context with p instead of
// W3C Trace Context (traceparent, tracestate). p writes and reads the
// event's headers, so the header names it uses must pass
// ferryevent.Validate.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(o *options) { o.prop = p }
}

// New returns a Tracer.
func New(opts ...Option) *Tracer {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	if o.prop == nil {
		o.prop = propagation.TraceContext{}
	}
	return &Tracer{tracer: o.tp.Tracer(ScopeName), prop: o.prop}
}

var (
	_ ferryhook.EmitHook    = (*Tracer)(nil)
	_ ferryhook.PublishHook = (*Tracer)(nil)
	_ ferryhook.IngestHook  = (*Tracer)(nil)
)

// OnEmit writes the trace context of ctx into ev's headers, unless ctx has
// no span or ev carries a traceparent already (ferryhook.EmitHook).
func (t *Tracer) OnEmit(ctx context.Context, ev *ferry.Event) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	if _, own := ev.Headers["traceparent"]; own {
		return
	}
	carrier := propagation.MapCarrier{}
	t.prop.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return
	}
	if ev.Headers == nil {
		ev.Headers = make(map[string]string, len(carrier))
	}
	for k, v := range carrier {
		if _, set := ev.Headers[k]; !set {
			ev.Headers[k] = v
		}
	}
}

// Extract returns ctx with the trace context ev carries, for code that
// reads events outside a ferry.Consumer.
func (t *Tracer) Extract(ctx context.Context, ev *ferry.Event) context.Context {
	if len(ev.Headers) == 0 {
		return ctx
	}
	return t.prop.Extract(ctx, propagation.MapCarrier(ev.Headers))
}

// OnPublish records the relay's "send" span of one event
// (ferryhook.PublishHook).
func (t *Tracer) OnPublish(info *ferryhook.PublishInfo) {
	ev := info.Event
	system := info.System
	if system == "" {
		system = ferryhook.DefaultSystem
	}
	parent := t.Extract(context.Background(), ev)
	_, span := t.tracer.Start(parent, "send "+ev.Topic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithTimestamp(info.Start),
		trace.WithAttributes(
			attribute.String("messaging.system", system),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "publish"),
			attribute.String("messaging.destination.name", ev.Topic),
			attribute.String("messaging.message.id", ev.ID.String()),
			attribute.String("ferry.key", ev.Key),
			attribute.String("ferry.seq", strconv.FormatInt(ev.Seq, 10)),
			attribute.String("ferry.feed", info.Feed),
		))
	if info.Err != nil {
		span.RecordError(info.Err)
		span.SetStatus(codes.Error, info.Err.Error())
	}
	span.End(trace.WithTimestamp(time.Now()))
}

// links returns a link to the trace context of each of evs that carries
// one.
func (t *Tracer) links(evs []*ferry.Event) []trace.Link {
	links := make([]trace.Link, 0, len(evs))
	for _, ev := range evs {
		if sc := trace.SpanContextFromContext(t.Extract(context.Background(), ev)); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}

// OnIngest records a consumer's "receive" span (kind consumer) for one
// delivery it put in its inbox (ferryhook.IngestHook), from the insert's start
// to its end: for one event, a child of the event's trace context; for
// several, linked to each event's context. Its messaging.system is the
// transport the delivery came through (ferryhook.IngestInfo.System).
func (t *Tracer) OnIngest(info *ferryhook.IngestInfo) {
	if len(info.Events) == 0 {
		return
	}
	system := info.System
	if system == "" {
		system = ferryhook.DefaultSystem
	}
	links := t.links(info.Events)
	parent := context.Background()
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", system),
		attribute.String("messaging.operation.type", "receive"),
		attribute.String("messaging.operation.name", "ingest"),
		attribute.String("messaging.destination.name", info.Events[0].Topic),
		attribute.String("messaging.consumer.group.name", info.Group),
		attribute.Int("messaging.batch.message_count", len(info.Events)),
		attribute.Int("ferry.inserted", info.Inserted),
	}
	if len(info.Events) == 1 {
		parent = t.Extract(parent, info.Events[0])
		attrs = append(attrs, attribute.String("messaging.message.id", info.Events[0].ID.String()))
	}
	_, span := t.tracer.Start(parent, "receive "+info.Events[0].Topic, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(info.Start), trace.WithLinks(links...), trace.WithAttributes(attrs...))
	if info.Err != nil {
		span.RecordError(info.Err)
		span.SetStatus(codes.Error, info.Err.Error())
	}
	span.End()
}

// Middleware returns consumer middleware that runs each handler call in a
// "process" span (see the package documentation).
func (t *Tracer) Middleware() ferry.Middleware {
	return func(ctx context.Context, evs []*ferry.Event, call func(context.Context) error) error {
		if len(evs) == 0 {
			return call(ctx)
		}
		links := t.links(evs)
		attrs := []attribute.KeyValue{
			// The handler reads from the consumer's inbox, whatever
			// brought the events there (see the package documentation).
			attribute.String("messaging.system", ferryhook.DefaultSystem),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.destination.name", evs[0].Topic),
			attribute.String("messaging.consumer.group.name", ferry.ConsumerGroup(ctx)),
		}
		parent := ctx
		if len(evs) == 1 {
			ev := evs[0]
			attrs = append(attrs,
				attribute.String("messaging.message.id", ev.ID.String()),
				attribute.String("ferry.key", ev.Key),
				attribute.String("ferry.seq", strconv.FormatInt(ev.Seq, 10)))
			// One event: the handler continues the producer's trace.
			parent = t.Extract(ctx, ev)
		} else {
			attrs = append(attrs, attribute.Int("messaging.batch.message_count", len(evs)))
		}
		ctx, span := t.tracer.Start(parent, "process "+evs[0].Topic,
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...), trace.WithAttributes(attrs...))
		defer span.End()
		err := call(ctx)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		return err
	}
}

var _ ferryhook.TxHook = (*Tracer)(nil)

// OnTxStart starts the span of a RunTx call, "RunTx" (kind internal), in
// which the attempts run (ferryhook.TxHook): pass the Tracer in
// TxOptions.Hooks. Each retry adds an event "retry" with the failed
// attempt, its cause and its error; the span ends with the number of
// attempts (ferry.tx.attempts) and, when RunTx fails, its error.
func (t *Tracer) OnTxStart(ctx context.Context, requestID string) (context.Context, ferryhook.TxObserver) {
	attrs := []attribute.KeyValue{}
	if requestID != "" {
		attrs = append(attrs, attribute.String("ferry.request_id", requestID))
	}
	ctx, span := t.tracer.Start(ctx, "RunTx", trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return ctx, txSpan{span}
}

type txSpan struct{ span trace.Span }

func (s txSpan) OnRetry(attempt int, cause string, err error) {
	attrs := []attribute.KeyValue{attribute.Int("ferry.tx.attempt", attempt), attribute.String("ferry.tx.cause", cause)}
	if err != nil {
		attrs = append(attrs, attribute.String("exception.message", err.Error()))
	}
	s.span.AddEvent("retry", trace.WithAttributes(attrs...))
}

func (s txSpan) OnEnd(attempts int, err error) {
	s.span.SetAttributes(attribute.Int("ferry.tx.attempts", attempts))
	if err != nil {
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, err.Error())
	}
	s.span.End()
}

var _ ferry.SettleHook = (*Tracer)(nil)

// OnSettleStart starts the span of an AwaitSettled call, "AwaitSettled"
// (kind internal), in which the wait runs (ferry.SettleHook): pass the
// Tracer among AwaitSettled's trailing hooks. The span records the group
// and how many events it waited for (ferry.settlement.events), and ends
// with the outcome (ferry.settlement.outcome: "settled", "failed" or
// "pending") and how many were pending or failed, or with the error.
func (t *Tracer) OnSettleStart(ctx context.Context, group string, ids []uuid.UUID) (context.Context, func(*ferry.Settlement, error)) {
	ctx, span := t.tracer.Start(ctx, "AwaitSettled", trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		attribute.String("messaging.consumer.group.name", group),
		attribute.Int("ferry.settlement.events", len(ids)),
	))
	return ctx, func(st *ferry.Settlement, err error) {
		defer span.End()
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			return
		}
		span.SetAttributes(
			attribute.String("ferry.settlement.outcome", st.Outcome()),
			attribute.Int("ferry.settlement.pending", len(st.Pending)),
			attribute.Int("ferry.settlement.failed", len(st.Failed)),
		)
	}
}

// LogHandler wraps h so that every record logged with a context carries
// trace_id and span_id: those of the span active in the context, or else,
// for the consumer's and the relay's records about one event (a failed
// attempt, a dead event, a dead letter, a held key:
// ferry.EventFromContext), those of the event's trace context (the span
// that emitted it). Give it
// to Ferry's loggers (ConsumerConfig.Logger, RelayConfig.Logger) and your
// own, and log with the handler's ctx (slog.InfoContext).
func (t *Tracer) LogHandler(h slog.Handler) slog.Handler { return &logHandler{next: h, t: t} }

type logHandler struct {
	next slog.Handler
	t    *Tracer
}

func (h *logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		if ev := ferry.EventFromContext(ctx); ev != nil {
			sc = trace.SpanContextFromContext(h.t.Extract(context.Background(), ev))
		}
	}
	if sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.next.Handle(ctx, r)
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logHandler{next: h.next.WithAttrs(attrs), t: h.t}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	return &logHandler{next: h.next.WithGroup(name), t: h.t}
}
