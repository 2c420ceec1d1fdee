package ferryotel_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryotel"
)

// benchTracer records into a span exporter that drops everything, through
// the SDK's batch processor, as a service would.
func benchTracer(b *testing.B) (*ferryotel.Tracer, context.Context) {
	tp := trace.NewTracerProvider(trace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("bench").Start(context.Background(), "request")
	b.Cleanup(func() { span.End() })
	return ferryotel.New(ferryotel.WithTracerProvider(tp)), ctx
}

func benchEvent() *ferry.Event {
	return &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: "order-1", Type: "OrderPlaced", Seq: 1, CreatedAt: time.Now(),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
}

// BenchmarkOnEmit: writing the trace context into an event at emit.
func BenchmarkOnEmit(b *testing.B) {
	tr, ctx := benchTracer(b)
	for b.Loop() {
		tr.OnEmit(ctx, &ferry.Event{Topic: "orders", Key: "k", Type: "T"})
	}
}

// BenchmarkOnPublish: the relay's send span of one event.
func BenchmarkOnPublish(b *testing.B) {
	tr, _ := benchTracer(b)
	info := &ferryhook.PublishInfo{Feed: "default/0", System: "nats", Event: benchEvent(), Start: time.Now()}
	for b.Loop() {
		tr.OnPublish(info)
	}
}

// BenchmarkMiddleware: the process span around one handler call.
func BenchmarkMiddleware(b *testing.B) {
	tr, _ := benchTracer(b)
	mw := tr.Middleware()
	evs := []*ferry.Event{benchEvent()}
	call := func(context.Context) error { return nil }
	for b.Loop() {
		if err := mw(context.Background(), evs, call); err != nil {
			b.Fatal(err)
		}
	}
}
