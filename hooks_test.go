package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/ferry-dev/ferry/ferryprom/ferrypromtest"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/ferry-dev/ferry/ferrysink"
)

type ctxKey struct{}

// recordingHook is an EmitHook and a PublishHook.
type recordingHook struct {
	mu        sync.Mutex
	published []ferryhook.PublishInfo
}

func (h *recordingHook) OnEmit(ctx context.Context, ev *ferry.Event) {
	if v, ok := ctx.Value(ctxKey{}).(string); ok {
		if ev.Headers == nil {
			ev.Headers = map[string]string{}
		}
		ev.Headers["x-from-context"] = v
	}
}

func (h *recordingHook) OnPublish(info *ferryhook.PublishInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.published = append(h.published, *info)
}

func (h *recordingHook) infos() []ferryhook.PublishInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]ferryhook.PublishInfo(nil), h.published...)
}

// TestHooksSeeEmitAndPublish: an EmitHook writes headers from the caller's
// context before validation (a header it writes is checked like the
// caller's), and a PublishHook hears of each published event with its
// feed, start and outcome.
func TestHooksSeeEmitAndPublish(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	hook := &recordingHook{}
	c, err := ferry.NewClient(drv, &ferry.Config{Hooks: []ferryhook.Hook{hook, "not a hook: ignored"}})
	require.NoError(t, err)
	ctx := context.WithValue(context.Background(), ctxKey{}, "req-42")
	ev := &ferry.Event{Topic: "orders", Key: "k1", Type: "T"}
	require.NoError(t, c.Emit(ctx, ev))
	require.Equal(t, "req-42", ev.Headers["x-from-context"])

	bad := &ferry.Event{Topic: "orders", Key: "k2", Type: "T"}
	err = c.Emit(context.WithValue(context.Background(), ctxKey{}, " spaced "), bad)
	require.ErrorIs(t, err, ferryevent.ErrSurroundingSpace, "what a hook adds is validated too")

	sink := &memsink.Sink{}
	r, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second, Hooks: []ferryhook.Hook{hook}})
	require.NoError(t, err)
	before := time.Now()
	run(t, r)
	require.Eventually(t, func() bool { return len(hook.infos()) == 1 }, 10*time.Second, 10*time.Millisecond)
	info := hook.infos()[0]
	require.Equal(t, "default/0", info.Feed)
	require.Equal(t, ev.ID, info.Event.ID)
	require.Equal(t, "req-42", info.Event.Headers["x-from-context"], "the header reached the relay through the outbox")
	require.NoError(t, info.Err)
	require.False(t, info.Start.Before(before.Add(-time.Second)))
	require.Equal(t, 1, sink.Len())
}

// TestMiddlewareWrapsEveryHandlerCall: middleware runs outermost first
// around every handler call, one event or a batch handler's events, with
// the group in the context; a middleware's error fails the call like a
// handler's, and a context it derives reaches the handler.
func TestMiddlewareWrapsEveryHandlerCall(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 32} {
		t.Run(fmt.Sprintf("BatchSize%d", batch), func(t *testing.T) {
			t.Parallel()
			drv := newPG(t)
			var mu sync.Mutex
			var trail []string
			note := func(s string) {
				mu.Lock()
				trail = append(trail, s)
				mu.Unlock()
			}
			outer := func(ctx context.Context, evs []*ferry.Event, call func(context.Context) error) error {
				note(fmt.Sprintf("outer %s %d %s", ferry.ConsumerGroup(ctx), len(evs), evs[0].Type))
				return call(context.WithValue(ctx, ctxKey{}, "from-outer"))
			}
			inner := func(ctx context.Context, evs []*ferry.Event, call func(context.Context) error) error {
				if evs[0].Key == "refused" {
					return errors.New("refused by middleware")
				}
				note("inner")
				return call(ctx)
			}
			var deadOnce sync.Once
			dead := make(chan string, 1)
			c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{
				Group: "mw", BatchSize: batch, Workers: 1, PollInterval: 20 * time.Millisecond, MaxAttempts: 1,
				Middleware: []ferry.Middleware{outer, inner},
				OnDead: func(_ context.Context, d *ferry.DeadEvent) {
					deadOnce.Do(func() { dead <- d.Err.Error() })
				},
			})
			require.NoError(t, err)
			handled := make(chan string, 10)
			c.HandleEvent("One", func(ctx context.Context, _ pgx.Tx, ev *ferry.Event) error {
				handled <- "One " + ev.Key + " " + ctx.Value(ctxKey{}).(string)
				return nil
			})
			ferry.HandleBatch(c, "Many", func(ctx context.Context, _ pgx.Tx, evs []*ferry.Event, _ []map[string]any) error {
				handled <- fmt.Sprintf("Many %d %s", len(evs), ctx.Value(ctxKey{}).(string))
				return nil
			})
			_, err = c.Ingest(context.Background(), []*ferry.Event{
				{ID: ferry.NewID(), Topic: "t", Key: "a", Type: "Many", Seq: 1, Payload: []byte(`{}`), CreatedAt: time.Now()},
				{ID: ferry.NewID(), Topic: "t", Key: "b", Type: "Many", Seq: 1, Payload: []byte(`{}`), CreatedAt: time.Now()},
			})
			require.NoError(t, err)
			startConsumer(t, c)
			var got []string
			for len(got) < 1 || (batch == 1 && len(got) < 2) {
				select {
				case h := <-handled:
					got = append(got, h)
				case <-time.After(20 * time.Second):
					t.Fatalf("handlers ran %v", got)
				}
			}
			_, err = c.Ingest(context.Background(), []*ferry.Event{
				{ID: ferry.NewID(), Topic: "t", Key: "c", Type: "One", Seq: 1, CreatedAt: time.Now()},
				{ID: ferry.NewID(), Topic: "t", Key: "refused", Type: "One", Seq: 1, CreatedAt: time.Now()},
			})
			require.NoError(t, err)
			select {
			case h := <-handled:
				got = append(got, h)
			case <-time.After(20 * time.Second):
				t.Fatalf("handlers ran %v", got)
			}
			select {
			case reason := <-dead:
				require.Contains(t, reason, "refused by middleware")
			case <-time.After(20 * time.Second):
				t.Fatal("the event the middleware refused did not go DEAD")
			}
			if batch == 1 {
				require.Equal(t, []string{"Many 1 from-outer", "Many 1 from-outer", "One c from-outer"}, got)
			} else {
				require.Equal(t, []string{"Many 2 from-outer", "One c from-outer"}, got, "one call for the batch handler's two events")
			}
			mu.Lock()
			defer mu.Unlock()
			joined := strings.Join(trail, "|")
			require.Contains(t, joined, "outer mw 1 One|inner")
			if batch > 1 {
				require.Contains(t, joined, "outer mw 2 Many|inner")
			}
		})
	}
}

// ingestRecorder is an IngestHook.
type ingestRecorder struct {
	mu    sync.Mutex
	infos []ferryhook.IngestInfo
}

func (h *ingestRecorder) OnIngest(info *ferryhook.IngestInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.infos = append(h.infos, *info)
}

func (h *ingestRecorder) systems() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, len(h.infos))
	for i, info := range h.infos {
		out[i] = info.System
	}
	return out
}

// describedSource delivers its events once, as a broker named system
// would, then waits for the end (a ferrysink.Source and Describer).
type describedSource struct {
	system string
	events []*ferry.Event
}

func (s *describedSource) System() string { return s.system }

func (s *describedSource) Run(ctx context.Context, ingest func(context.Context, []*ferry.Event) error) error {
	if err := ingest(ctx, s.events); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// TestIngestNamesItsTransport: each delivery reports the transport it came
// through to the IngestHook and in the ingest metric's system label: the
// system of its context (ferrysink.WithSystem), that of a source run by
// Consume that names one, "ferry" for the relay's inbox sink and when
// nothing names one.
func TestIngestNamesItsTransport(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newPG(t)
	reg := prometheus.NewRegistry()
	rec := &ingestRecorder{}
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "ingest", Hooks: []ferryhook.Hook{rec, ferryprom.New(reg)}})
	require.NoError(t, err)
	event := func(key string) *ferry.Event {
		return &ferry.Event{ID: ferry.NewID(), Topic: "t", Key: key, Type: "T", Seq: 1, CreatedAt: time.Now()}
	}

	_, err = c.Ingest(ctx, []*ferry.Event{event("a")})
	require.NoError(t, err)
	dup := event("b")
	_, err = c.Ingest(ferrysink.WithSystem(ctx, "webhook"), []*ferry.Event{dup})
	require.NoError(t, err)
	_, err = c.Ingest(ferrysink.WithSystem(ctx, "webhook"), []*ferry.Event{dup})
	require.NoError(t, err)
	require.NoError(t, c.Sink().Publish(ctx, []*ferry.Event{event("c")})[0])
	require.Equal(t, "ferry", c.Sink().(ferrysink.Describer).System(), "the relay's send spans name the direct path too")

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(runCtx, &describedSource{system: "nats", events: []*ferry.Event{event("d"), event("e")}})
	}()
	require.Eventually(t, func() bool { return len(rec.systems()) == 5 }, 30*time.Second, 10*time.Millisecond)
	stop()
	require.NoError(t, <-done)

	require.Equal(t, []string{"ferry", "webhook", "webhook", "ferry", "nats"}, rec.systems())
	for _, s := range []struct {
		system, result string
		want           float64
	}{{"ferry", "inserted", 2}, {"webhook", "inserted", 1}, {"webhook", "duplicate", 1}, {"nats", "inserted", 2}, {"nats", "duplicate", 0}} {
		got, ok := ferrypromtest.Value(t, reg, "ferry_consumer_ingested_events_total", map[string]string{"group": "ingest", "system": s.system, "result": s.result})
		require.True(t, ok, "no series for system %s, result %s", s.system, s.result)
		require.Equal(t, s.want, got, "system %s, result %s", s.system, s.result)
	}
}
