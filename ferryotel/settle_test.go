package ferryotel_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryotel/ferryoteltest"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/ferry-dev/ferry/ferryprom/ferrypromtest"
)

var quiet = slog.New(slog.DiscardHandler)

// runConsumer runs c until the test ends and requires that Run returned
// nil.
func runConsumer(t *testing.T, c *ferry.Consumer[pgx.Tx]) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// attrs returns a span's attributes as strings.
func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

// TestAwaitSettledGivesSpanAndMetric: one AwaitSettled call with the
// Prometheus hook and the Tracer records both the wait's metric and its
// span, a child of the caller's, with the outcome: once settled, once
// pending at the deadline.
func TestAwaitSettledGivesSpanAndMetric(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, tp, rec := ferryoteltest.Recorder(t)
	drv := ferryoteltest.Driver(ctx, t)
	reg := prometheus.NewRegistry()
	prom := ferryprom.New(reg)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", PollInterval: 20 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	c.HandleAll(func(context.Context, pgx.Tx, *ferry.Event) error { return nil })
	ev := &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: "order-1", Type: "OrderPlaced", Seq: 1, CreatedAt: time.Now()}
	_, err = c.Ingest(ctx, []*ferry.Event{ev})
	require.NoError(t, err)
	runConsumer(t, c)

	reqCtx, req := tp.Tracer("app").Start(ctx, "POST /orders")
	st, err := ferry.AwaitSettled(reqCtx, drv, "billing", []uuid.UUID{ev.ID}, 30*time.Second, prom, tr)
	require.NoError(t, err)
	require.True(t, st.Done())
	missing := uuid.New()
	st, err = ferry.AwaitSettled(reqCtx, drv, "billing", []uuid.UUID{missing}, 10*time.Millisecond, prom, tr)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{missing}, st.Pending)
	req.End()

	var waits []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "AwaitSettled" {
			waits = append(waits, s)
		}
	}
	require.Len(t, waits, 2, "one span per call")
	for i, outcome := range []string{"settled", "pending"} {
		s := waits[i]
		require.Equal(t, req.SpanContext().SpanID(), s.Parent().SpanID(), "the wait's span is a child of the caller's")
		require.Equal(t, trace.SpanKindInternal, s.SpanKind())
		a := attrs(s)
		require.Equal(t, outcome, a["ferry.settlement.outcome"])
		require.Equal(t, "billing", a["messaging.consumer.group.name"])
		require.Equal(t, "1", a["ferry.settlement.events"])

		n, ok := ferrypromtest.Value(t, reg, "ferry_settlement_wait_seconds", map[string]string{"outcome": outcome})
		require.True(t, ok, "no ferry_settlement_wait_seconds{outcome=%q}", outcome)
		require.Equal(t, 1.0, n, "one wait observed with outcome %s", outcome)
	}
}
