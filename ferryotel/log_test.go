package ferryotel_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryotel/ferryoteltest"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
)

// records decodes the JSON log lines written to logs.
func records(t *testing.T, logs *syncbuf.Buffer) []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		out = append(out, m)
	}
	return out
}

// TestLogsCarryTraceIDs: with LogHandler, a handler's own record carries
// its process span's IDs, and the consumer's record of the handler's
// failure carries the trace of the request that emitted the event.
func TestLogsCarryTraceIDs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, tp, rec := ferryoteltest.Recorder(t)
	logs := &syncbuf.Buffer{}
	log := slog.New(tr.LogHandler(slog.NewJSONHandler(logs, nil)))
	drv := ferryoteltest.Driver(ctx, t)
	client, err := ferry.NewClient(drv, &ferry.Config{Hooks: []ferryhook.Hook{tr}})
	require.NoError(t, err)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", PollInterval: 20 * time.Millisecond, RetryBase: 10 * time.Millisecond,
		Logger: log, Middleware: []ferry.Middleware{tr.Middleware()}})
	require.NoError(t, err)
	done := make(chan struct{})
	var attempts atomic.Int32
	c.HandleAll(func(ctx context.Context, _ pgx.Tx, ev *ferry.Event) error {
		n := attempts.Add(1)
		log.InfoContext(ctx, "applying", "attempt", n)
		if n == 1 {
			return errors.New("card declined")
		}
		close(done)
		return nil
	})
	relay, err := ferry.NewRelay(drv, c.Sink(), &ferry.RelayConfig{Feed: "billing", PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second, Logger: log})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return relay.Run(runCtx) })
	g.Go(func() error { return c.Run(runCtx) })

	reqCtx, req := tp.Tracer("app").Start(ctx, "POST /orders")
	require.NoError(t, client.Emit(reqCtx, &ferry.Event{Topic: "orders", Key: "order-1", Type: "OrderPlaced"}))
	req.End()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the event was not applied")
	}
	stop()
	require.NoError(t, g.Wait())

	traceID := req.SpanContext().TraceID().String()
	var processSpans []string
	for _, s := range rec.Ended() {
		if s.Name() == "process orders" {
			processSpans = append(processSpans, s.SpanContext().SpanID().String())
		}
	}
	var applying, failed int
	for _, r := range records(t, logs) {
		switch r["msg"] {
		case "applying":
			applying++
			require.Equal(t, traceID, r["trace_id"], "a handler's record carries the trace")
			require.Contains(t, processSpans, r["span_id"], "and its process span")
		case "ferry: handler failed; will retry":
			failed++
			require.Equal(t, traceID, r["trace_id"], "the consumer's record of a failed event carries the event's trace")
			require.Equal(t, req.SpanContext().SpanID().String(), r["span_id"])
		}
	}
	require.Equal(t, 2, applying)
	require.Equal(t, 1, failed)
}

// TestRelayDeadLetterLogCarriesTrace: with LogHandler, the relay's record
// of an event it dead-lettered (the destination refused it for good)
// carries the trace of the request that emitted the event, though the
// relay logs it outside any span.
func TestRelayDeadLetterLogCarriesTrace(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, tp, _ := ferryoteltest.Recorder(t)
	logs := &syncbuf.Buffer{}
	log := slog.New(tr.LogHandler(slog.NewJSONHandler(logs, nil)))
	drv := ferryoteltest.Driver(ctx, t)
	client, err := ferry.NewClient(drv, &ferry.Config{Hooks: []ferryhook.Hook{tr}})
	require.NoError(t, err)
	sink := &memsink.Sink{Permanent: func(ev *ferryevent.Event) bool { return ev.Key == "refused" }}
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second, Logger: log,
		Hooks: []ferryhook.Hook{tr}})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return relay.Run(runCtx) })

	reqCtx, req := tp.Tracer("app").Start(ctx, "POST /orders")
	ev := &ferry.Event{Topic: "orders", Key: "refused", Type: "OrderPlaced"}
	require.NoError(t, client.Emit(reqCtx, ev))
	req.End()
	var dead map[string]any
	require.Eventually(t, func() bool {
		for _, r := range records(t, logs) {
			if r["msg"] == "ferry: event dead-lettered" {
				dead = r
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "the relay did not log the dead letter")
	stop()
	require.NoError(t, g.Wait())

	require.Equal(t, ev.ID.String(), dead["event_id"])
	require.Equal(t, req.SpanContext().TraceID().String(), dead["trace_id"], "the record carries the emitting request's trace")
	require.Equal(t, req.SpanContext().SpanID().String(), dead["span_id"])
	require.Equal(t, "WARN", dead["level"])
}
