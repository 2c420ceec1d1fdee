package ferryotel_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryotel/ferryoteltest"
)

// TestBatchCallLinksEachEvent: a batch handler's call (HandleEventBatch,
// BatchSize > 1) runs in one process span linked to the trace context of
// each of its events, each emitted in a request of its own, and the
// handler's ctx carries that span.
func TestBatchCallLinksEachEvent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, tp, rec := ferryoteltest.Recorder(t)
	drv := ferryoteltest.Driver(ctx, t)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", BatchSize: 8, Workers: 1, PollInterval: 20 * time.Millisecond,
		Logger: quiet, Middleware: []ferry.Middleware{tr.Middleware()}})
	require.NoError(t, err)
	type call struct {
		span trace.SpanContext
		evs  []*ferry.Event
	}
	var mu sync.Mutex
	var calls []call
	done := make(chan struct{})
	c.HandleEventBatch("OrderPlaced", func(ctx context.Context, _ pgx.Tx, evs []*ferry.Event) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, call{trace.SpanContextFromContext(ctx), evs})
		if len(calls) == 1 {
			close(done)
		}
		return nil
	})

	// Four events of different keys, each from a request of its own, in
	// the inbox before the consumer runs: its first claim takes them all.
	const n = 4
	requests := map[trace.SpanID]bool{}
	var evs []*ferry.Event
	for i := range n {
		reqCtx, req := tp.Tracer("app").Start(ctx, "POST /orders")
		ev := &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: "order-" + strconv.Itoa(i), Type: "OrderPlaced", Seq: 1, CreatedAt: time.Now()}
		tr.OnEmit(reqCtx, ev) // what EmitTx does with the Tracer in Config.Hooks
		req.End()
		requests[req.SpanContext().SpanID()] = true
		evs = append(evs, ev)
	}
	_, err = c.Ingest(ctx, evs)
	require.NoError(t, err)
	runConsumer(t, c)
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the batch handler was not called")
	}

	mu.Lock()
	first := calls[0]
	mu.Unlock()
	require.Len(t, first.evs, n, "one call for the batch's events")
	var process sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if s.SpanContext().SpanID() == first.span.SpanID() {
				process = s
			}
		}
		return process != nil
	}, 10*time.Second, 10*time.Millisecond, "the call's span did not end")
	require.Equal(t, "process orders", process.Name())
	require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
	require.False(t, process.Parent().IsValid(), "a batch's span has no one parent: it links to each event's context")
	require.Len(t, process.Links(), n, "one link per event")
	linked := map[trace.SpanID]bool{}
	for _, l := range process.Links() {
		linked[l.SpanContext.SpanID()] = true
	}
	require.Equal(t, requests, linked, "each link is the context of the request that emitted one of the events")
	a := attrs(process)
	require.Equal(t, strconv.Itoa(n), a["messaging.batch.message_count"])
	require.Equal(t, "process", a["messaging.operation.type"])
	require.Equal(t, "billing", a["messaging.consumer.group.name"])
}
