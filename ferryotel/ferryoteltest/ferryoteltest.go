// Package ferryoteltest checks that one OpenTelemetry trace follows an
// event from the request that emits it, through the relay and a path to a
// consumer (a broker and its source, or the inbox sink), to the handler
// that applies it. Each path's tests call Exercise with its Pipeline.
//
// Stability: this package may change between minor versions until 1.0.
package ferryoteltest

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryotel"
	"github.com/ferry-dev/ferry/ferrysink"
)

var quiet = slog.New(slog.DiscardHandler)

// Pipeline is one path an event can take from the relay to a consumer.
type Pipeline struct {
	// System is the messaging.system the relay's send span and the
	// consumer's receive span must name: the transport of the path.
	System string
	// Wire connects the relay to the consumer c: it returns the relay's
	// sink and, when the events travel through a broker, the source c
	// reads (nil when the sink feeds c itself, as c.Sink() does). It
	// registers its cleanup with t.
	Wire func(t *testing.T, ctx context.Context, c *ferry.Consumer[pgx.Tx]) (ferrysink.Sink, ferrysink.Source)
}

// Recorder returns a Tracer whose spans go to an in-memory recorder, with
// its provider (for the test's own spans); the provider shuts down when the
// test ends.
func Recorder(t testing.TB) (*ferryotel.Tracer, *sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return ferryotel.New(ferryotel.WithTracerProvider(tp)), tp, rec
}

// Driver returns a PostgreSQL driver on a fresh, migrated schema of the
// test server (ferrypgtest), dropped when the test ends.
func Driver(ctx context.Context, t testing.TB) *ferrypg.Driver[pgx.Tx] {
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv
}

// Exercise emits one event on PostgreSQL inside a request span and checks
// the trace it leaves: the relay's send span, the consumer's receive span
// and the handler's process span are children of the request span
// (process linked to it too), a span the handler starts is a child of
// process, AwaitSettled's span records the outcome, and the attributes
// follow the messaging conventions: send and receive name the path's
// System, process names "ferry" (the inbox it reads).
func Exercise(t *testing.T, p Pipeline) {
	t.Helper()
	testOneTrace(t, p)
}

func testOneTrace(t *testing.T, p Pipeline) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, tp, rec := Recorder(t)
	pool := ferrypgtest.Pool(t)
	drv := Driver(ctx, t)
	client, err := ferry.NewClient(drv, &ferry.Config{Hooks: []ferryhook.Hook{tr}})
	require.NoError(t, err)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", PollInterval: 20 * time.Millisecond, Logger: quiet,
		Hooks: []ferryhook.Hook{tr}, Middleware: []ferry.Middleware{tr.Middleware()}})
	require.NoError(t, err)
	handled := make(chan struct{}, 1)
	var once sync.Once
	c.HandleAll(func(ctx context.Context, _ pgx.Tx, ev *ferry.Event) error {
		_, span := tp.Tracer("app").Start(ctx, "apply "+ev.Type)
		span.End()
		once.Do(func() { close(handled) })
		return nil
	})
	sink, source := p.Wire(t, ctx, c)
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{Feed: "billing", PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second, Logger: quiet,
		Hooks: []ferryhook.Hook{tr}})
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return relay.Run(runCtx) })
	g.Go(func() error { return c.Run(runCtx) })
	if source != nil {
		g.Go(func() error { return c.Consume(runCtx, source) })
	}

	reqCtx, req := tp.Tracer("app").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	ev := &ferry.Event{Topic: "orders", Key: "order-1", Type: "OrderPlaced", Payload: []byte(`{}`)}
	require.NoError(t, pgx.BeginFunc(reqCtx, pool, func(tx pgx.Tx) error { return client.EmitTx(reqCtx, tx, ev) }))
	req.End()
	require.Equal(t, "00-"+req.SpanContext().TraceID().String()+"-"+req.SpanContext().SpanID().String()+"-01", ev.Headers["traceparent"],
		"EmitTx writes the request's trace context into the event")

	select {
	case <-handled:
	case <-ctx.Done():
		t.Fatal("the event did not reach its handler")
	}
	st, err := ferry.AwaitSettled(reqCtx, drv, "billing", []uuid.UUID{ev.ID}, 10*time.Second, tr)
	require.NoError(t, err)
	require.True(t, st.Done())
	stop()
	require.NoError(t, g.Wait())

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	request, send, process, apply := spans["POST /orders"], spans["send orders"], spans["process orders"], spans["apply OrderPlaced"]
	settled, receive := spans["AwaitSettled"], spans["receive orders"]
	for name, s := range map[string]sdktrace.ReadOnlySpan{"send": send, "receive": receive, "process": process, "apply": apply, "AwaitSettled": settled} {
		require.NotNil(t, s, "no %s span; recorded: %v", name, names(rec.Ended()))
		require.Equal(t, request.SpanContext().TraceID(), s.SpanContext().TraceID(), "%s span: one trace", name)
	}
	require.Equal(t, request.SpanContext().SpanID(), send.Parent().SpanID(), "send: a child of the request")
	require.Equal(t, trace.SpanKindProducer, send.SpanKind())
	require.Equal(t, request.SpanContext().SpanID(), process.Parent().SpanID(), "process: a child of the request")
	require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
	require.Len(t, process.Links(), 1)
	require.Equal(t, request.SpanContext().SpanID(), process.Links()[0].SpanContext.SpanID(), "process: linked to the creation context")
	require.Equal(t, process.SpanContext().SpanID(), apply.Parent().SpanID(), "the handler's own span: a child of process")
	require.False(t, send.StartTime().After(send.EndTime()))

	require.Equal(t, request.SpanContext().SpanID(), settled.Parent().SpanID())
	require.Equal(t, request.SpanContext().SpanID(), receive.Parent().SpanID(), "receive: a child of the request")
	require.Equal(t, trace.SpanKindConsumer, receive.SpanKind())
	requireAttrs(t, receive, map[string]string{"messaging.system": p.System, "messaging.operation.type": "receive", "messaging.consumer.group.name": "billing",
		"messaging.message.id": ev.ID.String(), "messaging.batch.message_count": "1", "ferry.inserted": "1"})
	requireAttrs(t, settled, map[string]string{"ferry.settlement.outcome": "settled", "messaging.consumer.group.name": "billing", "ferry.settlement.events": "1"})
	requireAttrs(t, send, map[string]string{
		"messaging.system": p.System, "messaging.operation.type": "send", "messaging.destination.name": "orders",
		"messaging.message.id": ev.ID.String(), "ferry.key": "order-1", "ferry.feed": "billing/0",
	})
	requireAttrs(t, process, map[string]string{
		"messaging.system": ferryhook.DefaultSystem, "messaging.operation.type": "process", "messaging.destination.name": "orders", "messaging.message.id": ev.ID.String(),
		"messaging.consumer.group.name": "billing", "ferry.key": "order-1",
	})
}

func requireAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, kv := range s.Attributes() {
		got[string(kv.Key)] = kv.Value.String()
	}
	for k, v := range want {
		require.Equal(t, v, got[k], "span %q: attribute %s (all: %v)", s.Name(), k, got)
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = fmt.Sprintf("%s(%s)", s.Name(), s.SpanKind())
	}
	return out
}
