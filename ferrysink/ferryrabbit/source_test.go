package ferryrabbit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/tcpproxy"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
	"github.com/ferry-dev/ferry/ferrysink/ferrysinktest"
)

// TestSourceConformance runs the source suite on quorum queues declared by
// NewSource.
func TestSourceConformance(t *testing.T) {
	t.Parallel()
	url := testURL(t)
	ferrysinktest.ExerciseSource(t, ferrysinktest.SourceHarness{
		New: func(t *testing.T) (func(context.Context, []*ferryevent.Event) error, func(t *testing.T) ferrysink.Source) {
			sink, cfg := sourceQueue(t, ferryrabbit.SourceConfig{URL: url, RetryBase: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond})
			publish := func(ctx context.Context, events []*ferryevent.Event) error {
				return errors.Join(sink.Publish(ctx, events)...)
			}
			return publish, func(t *testing.T) ferrysink.Source {
				src, err := ferryrabbit.NewSource(testContext(t), &cfg)
				require.NoError(t, err)
				return src
			}
		},
		System: "rabbitmq",
	})
}

// sourceQueue creates a sink on a fresh exchange and, with NewSource, a
// quorum queue bound to it with "#". It returns the sink and cfg completed
// with the names, for further sources of the same queue.
func sourceQueue(t *testing.T, cfg ferryrabbit.SourceConfig) (*ferryrabbit.Sink, ferryrabbit.SourceConfig) {
	t.Helper()
	top := names(t)
	if cfg.URL == "" {
		cfg.URL = testURL(t)
	}
	sink, err := ferryrabbit.New(testContext(t), &ferryrabbit.Config{URL: testURL(t), Exchange: top.exchange, DeclareExchange: true, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sink.Close(context.Background())) })
	cfg.Queue, cfg.Exchange, cfg.DeclareQueue = top.queue, top.exchange, true
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	_, err = ferryrabbit.NewSource(testContext(t), &cfg)
	require.NoError(t, err)
	return sink, cfg
}

func newSource(t *testing.T, cfg ferryrabbit.SourceConfig) *ferryrabbit.Source {
	t.Helper()
	src, err := ferryrabbit.NewSource(testContext(t), &cfg)
	require.NoError(t, err)
	return src
}

// publishKeyed publishes perKey events for each key, with Seq 1..perKey,
// one event per key per call, as the relay does.
func publishKeyed(t *testing.T, sink *ferryrabbit.Sink, keys []string, perKey int) []*ferryevent.Event {
	t.Helper()
	var all []*ferryevent.Event
	for seq := 1; seq <= perKey; seq++ {
		round := make([]*ferryevent.Event, 0, len(keys))
		for _, k := range keys {
			ev := event("orders", k)
			ev.Seq = int64(seq)
			ev.Payload = fmt.Appendf(nil, `{"key":%q,"seq":%d}`, k, seq)
			round = append(round, ev)
		}
		for _, err := range sink.Publish(testContext(t), round) {
			require.NoError(t, err)
		}
		all = append(all, round...)
	}
	return all
}

// recorder is an ingest function standing in for a consumer's inbox: it
// keeps every call and the first delivery of each event.
type recorder struct {
	// fail, when set, is called before an ingest is recorded; a non-nil
	// result fails the call. call counts from 0.
	fail func(ctx context.Context, call int, events []*ferryevent.Event) error

	mu    sync.Mutex
	calls [][]uuid.UUID
	seen  map[uuid.UUID]bool
	inbox []*ferryevent.Event
	want  int
	done  chan struct{}
}

func newRecorder(want int) *recorder {
	return &recorder{seen: make(map[uuid.UUID]bool), want: want, done: make(chan struct{})}
}

func (r *recorder) ingest(ctx context.Context, events []*ferryevent.Event) error {
	ids := make([]uuid.UUID, len(events))
	for i, ev := range events {
		ids[i] = ev.ID
	}
	r.mu.Lock()
	call := len(r.calls)
	r.calls = append(r.calls, ids)
	r.mu.Unlock()
	if r.fail != nil {
		if err := r.fail(ctx, call, events); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range events {
		if !r.seen[ev.ID] {
			r.seen[ev.ID] = true
			r.inbox = append(r.inbox, ev)
		}
	}
	if len(r.inbox) >= r.want && r.want > 0 {
		select {
		case <-r.done:
		default:
			close(r.done)
		}
	}
	return nil
}

func (r *recorder) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("ingested %d of %d events", len(r.inbox), r.want)
	}
}

func (r *recorder) snapshot() (calls [][]uuid.UUID, inbox []*ferryevent.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]uuid.UUID(nil), r.calls...), append([]*ferryevent.Event(nil), r.inbox...)
}

// running is a Source.Run in progress.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, src *ferryrabbit.Source, ingest func(context.Context, []*ferryevent.Event) error) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- src.Run(ctx, ingest) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			r.done <- err
		case <-time.After(5 * time.Second):
			t.Error("Source.Run did not return within 5 s of its context ending")
		}
	})
	return r
}

// stop cancels Run and returns its result, failing if it takes longer than
// the suite allows.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

func (r *running) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Source.Run did not return")
		return nil
	}
}

// requireKeyOrder checks that inbox holds each key's events exactly once,
// Seq 1..perKey in order.
func requireKeyOrder(t *testing.T, inbox []*ferryevent.Event, keys []string, perKey int) {
	t.Helper()
	got := make(map[string][]int64)
	for _, ev := range inbox {
		got[ev.Key] = append(got[ev.Key], ev.Seq)
	}
	want := make([]int64, perKey)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for _, k := range keys {
		require.Equal(t, want, got[k], "key %s", k)
	}
	require.Len(t, inbox, len(keys)*perKey)
}

func TestSourceDeliversInBatches(t *testing.T) {
	t.Parallel()
	sink, cfg := sourceQueue(t, ferryrabbit.SourceConfig{Batch: 16})
	keys := []string{"a", "b", "c", "d"}
	published := publishKeyed(t, sink, keys, 50)

	rec := newRecorder(len(published))
	run := start(t, newSource(t, cfg), rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))

	calls, inbox := rec.snapshot()
	requireKeyOrder(t, inbox, keys, 50)
	delivered := 0
	for _, c := range calls {
		require.LessOrEqual(t, len(c), 16)
		delivered += len(c)
	}
	require.Equal(t, len(published), delivered, "an event was ingested twice")
	require.Equal(t, published[0].Payload, inbox[0].Payload)
	require.Zero(t, queueDepth(t, cfg.Queue), "everything ingested is acknowledged")
}

func TestSourceRetriesTheSameBatch(t *testing.T) {
	t.Parallel()
	sink, cfg := sourceQueue(t, ferryrabbit.SourceConfig{Batch: 8, RetryBase: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	keys := []string{"a", "b", "c"}
	publishKeyed(t, sink, keys, 10)

	const failures = 3
	rec := newRecorder(30)
	rec.fail = func(_ context.Context, call int, _ []*ferryevent.Event) error {
		if call < failures {
			return errors.New("inbox unavailable")
		}
		return nil
	}
	run := start(t, newSource(t, cfg), rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))

	calls, inbox := rec.snapshot()
	require.Len(t, calls[0], 8)
	for i := 1; i <= failures; i++ {
		require.Equal(t, calls[0], calls[i], "call %d did not retry the failed batch", i)
	}
	requireKeyOrder(t, inbox, keys, 10)
}

func TestSourceRejectsInvalidMessages(t *testing.T) {
	t.Parallel()
	dlq := names(t).queue
	require.NoError(t, admin(t, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(dlq, true, false, false, false, nil)
		return err
	}))
	sink, cfg := sourceQueue(t, ferryrabbit.SourceConfig{
		Batch:     4,
		QueueArgs: amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
	})
	publishKeyed(t, sink, []string{"a"}, 3)
	// Not a Ferry event at all, then one with a broken attribute.
	require.NoError(t, admin(t, func(ch *amqp.Channel) error {
		if err := ch.Publish(cfg.Exchange, "orders", false, false, amqp.Publishing{Body: []byte("garbage")}); err != nil {
			return err
		}
		return ch.Publish(cfg.Exchange, "orders", false, false, amqp.Publishing{
			Headers: amqp.Table{"cloudEvents_specversion": "1.0", "cloudEvents_id": "not-a-uuid"},
			Body:    []byte("{}"),
		})
	}))
	publishKeyed(t, sink, []string{"b"}, 3)

	var (
		mu       sync.Mutex
		invalids []error
		bodies   [][]byte
	)
	cfg.OnInvalid = func(_ context.Context, d amqp.Delivery, err error) {
		mu.Lock()
		defer mu.Unlock()
		invalids = append(invalids, err)
		bodies = append(bodies, d.Body)
	}
	rec := newRecorder(6) // a:1..3, b:1..3
	run := start(t, newSource(t, cfg), rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))

	_, inbox := rec.snapshot()
	requireKeyOrder(t, inbox, []string{"a", "b"}, 3)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, invalids, 2)
	for _, err := range invalids {
		require.ErrorIs(t, err, ferryrabbit.ErrMalformed)
	}
	require.ErrorContains(t, invalids[0], "header cloudEvents_specversion is missing")
	require.ErrorContains(t, invalids[1], `"not-a-uuid" is not a UUID`)
	require.Equal(t, [][]byte{[]byte("garbage"), []byte("{}")}, bodies)
	// Rejected without requeueing: dead-lettered, not back in the queue.
	require.Eventually(t, func() bool { return queueDepth(t, dlq) == 2 }, 10*time.Second, 20*time.Millisecond)
	require.Zero(t, queueDepth(t, cfg.Queue))
}

func TestSourceLogsInvalidMessagesByDefault(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		logs bytes.Buffer
	)
	logger := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, nil))
	sink, cfg := sourceQueue(t, ferryrabbit.SourceConfig{Logger: logger})
	require.NoError(t, admin(t, func(ch *amqp.Channel) error {
		return ch.Publish(cfg.Exchange, "orders", false, false, amqp.Publishing{MessageId: "m-1", Body: []byte("garbage")})
	}))
	publishKeyed(t, sink, []string{"a"}, 1)

	rec := newRecorder(1)
	run := start(t, newSource(t, cfg), rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, logs.String(), "message is not a Ferry event")
	require.Contains(t, logs.String(), "message_id=m-1")
	require.Contains(t, logs.String(), "routing_key=orders")
	require.Zero(t, queueDepth(t, cfg.Queue))
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestSourceReconnects cuts the source's connection while it consumes:
// Run reconnects, and every event reaches the inbox with each key's order
// kept (an event may come twice; the inbox keeps the first).
func TestSourceReconnects(t *testing.T) {
	t.Parallel()
	proxy, err := tcpproxy.Start(brokerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	sink, cfg := sourceQueue(t, ferryrabbit.SourceConfig{Batch: 5, RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond})
	keys := []string{"a", "b", "c"}
	publishKeyed(t, sink, keys, 40)

	cfg.URL = viaProxy(t, proxy.Addr())
	var (
		mu    sync.Mutex
		order = make(map[string][]int64) // every ingested Seq per key, copies included
	)
	rec := newRecorder(len(keys) * 40)
	rec.fail = func(_ context.Context, call int, events []*ferryevent.Event) error {
		mu.Lock()
		for _, ev := range events {
			order[ev.Key] = append(order[ev.Key], ev.Seq)
		}
		mu.Unlock()
		if call%6 == 5 {
			proxy.Reset() // the batch is ingested, its ack is lost
		}
		return nil
	}
	run := start(t, newSource(t, cfg), rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))

	_, inbox := rec.snapshot()
	requireKeyOrder(t, inbox, keys, 40)
	// A copy only ever repeats what came before, never skips back past a
	// later event of its key by more than the redelivered batch.
	mu.Lock()
	defer mu.Unlock()
	copies := 0
	for _, k := range keys {
		var high int64
		for _, seq := range order[k] {
			if seq <= high {
				copies++
			}
			require.LessOrEqual(t, seq, high+1, "key %s: seq %d ingested before %d", k, seq, high+1)
			high = max(high, seq)
		}
	}
	t.Logf("%d events ingested again after resets", copies)
}

// TestSourceSingleActiveConsumer runs two sources on one queue: RabbitMQ
// delivers to the first only; when it stops, the second takes over where
// it left off.
func TestSourceSingleActiveConsumer(t *testing.T) {
	t.Parallel()
	sink, cfg := sourceQueue(t, ferryrabbit.SourceConfig{Batch: 5})
	keys := []string{"a", "b"}
	publishKeyed(t, sink, keys, 10)

	first := newRecorder(20)
	run1 := start(t, newSource(t, cfg), first.ingest)
	first.wait(t)
	second := newRecorder(20)
	run2 := start(t, newSource(t, cfg), second.ingest)
	publishKeyed(t, sink, keys, 5) // seq 1..5 again, new IDs
	require.Eventually(t, func() bool {
		_, inbox := first.snapshot()
		return len(inbox) == 30
	}, 10*time.Second, 10*time.Millisecond, "the first source keeps consuming")
	_, idle := second.snapshot()
	require.Empty(t, idle, "the second source stands by")

	require.NoError(t, run1.stop(t))
	publishKeyed(t, sink, keys, 10)
	second.wait(t)
	require.NoError(t, run2.stop(t))
	_, inbox := second.snapshot()
	requireKeyOrder(t, inbox, keys, 10)
}

func TestSourceStopsPromptly(t *testing.T) {
	t.Parallel()

	t.Run("waiting for messages", func(t *testing.T) {
		t.Parallel()
		_, cfg := sourceQueue(t, ferryrabbit.SourceConfig{})
		consumers := func() int { return queueConsumers(t, cfg.Queue) }
		run := start(t, newSource(t, cfg), newRecorder(0).ingest)
		require.Eventually(t, func() bool { return consumers() == 1 }, 10*time.Second, 10*time.Millisecond)
		began := time.Now()
		require.NoError(t, run.stop(t))
		require.Less(t, time.Since(began), 2*time.Second)
		require.Eventually(t, func() bool { return consumers() == 0 }, 5*time.Second, 10*time.Millisecond, "the consumer is cancelled")
	})

	t.Run("backing off", func(t *testing.T) {
		t.Parallel()
		sink, cfg := sourceQueue(t, ferryrabbit.SourceConfig{RetryBase: time.Hour, RetryMax: time.Hour})
		publishKeyed(t, sink, []string{"a"}, 1)
		failed := make(chan struct{})
		rec := newRecorder(0)
		rec.fail = func(context.Context, int, []*ferryevent.Event) error {
			select {
			case <-failed:
			default:
				close(failed)
			}
			return errors.New("inbox unavailable")
		}
		run := start(t, newSource(t, cfg), rec.ingest)
		<-failed
		began := time.Now()
		require.NoError(t, run.stop(t))
		require.Less(t, time.Since(began), 2*time.Second)
		require.Eventually(t, func() bool { return queueDepth(t, cfg.Queue) == 1 }, 5*time.Second, 10*time.Millisecond, "the failed batch goes back to the queue")
	})
}

func TestSourceQueueDeleted(t *testing.T) {
	t.Parallel()
	_, cfg := sourceQueue(t, ferryrabbit.SourceConfig{RetryBase: 10 * time.Millisecond, RetryMax: 10 * time.Millisecond})
	run := start(t, newSource(t, cfg), newRecorder(0).ingest)
	require.Eventually(t, func() bool { return queueConsumers(t, cfg.Queue) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, admin(t, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(cfg.Queue, false, false, false)
		return err
	}))
	var err error
	select {
	case err = <-run.done:
		run.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its queue was deleted")
	}
	require.ErrorContains(t, err, `queue "`+cfg.Queue+`" no longer exists`)
	require.ErrorContains(t, err, "SourceConfig.DeclareQueue")
}

func TestSourceRunTwice(t *testing.T) {
	t.Parallel()
	_, cfg := sourceQueue(t, ferryrabbit.SourceConfig{})
	src := newSource(t, cfg)
	run := start(t, src, newRecorder(0).ingest)
	require.Eventually(t, func() bool { return queueConsumers(t, cfg.Queue) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.ErrorContains(t, src.Run(testContext(t), newRecorder(0).ingest), "already running")
	require.NoError(t, run.stop(t))
	require.ErrorContains(t, src.Run(testContext(t), nil), "ingest function")
}

func TestNewSourceChecksTheQueue(t *testing.T) {
	t.Parallel()
	top := names(t)
	_, err := ferryrabbit.NewSource(testContext(t), &ferryrabbit.SourceConfig{URL: testURL(t), Queue: top.queue})
	require.ErrorContains(t, err, `queue "`+top.queue+`" not found`)
	require.ErrorContains(t, err, "SourceConfig.DeclareQueue")

	_, err = ferryrabbit.NewSource(testContext(t), &ferryrabbit.SourceConfig{URL: testURL(t), Queue: top.queue, DeclareQueue: true, Exchange: top.exchange})
	require.ErrorContains(t, err, `exchange "`+top.exchange+`", which SourceConfig.Exchange names for the queue's bindings, not found`)

	// Declared as a quorum queue, it cannot be declared again as classic.
	_, err = ferryrabbit.NewSource(testContext(t), &ferryrabbit.SourceConfig{URL: testURL(t), Queue: top.queue, DeclareQueue: true, Exchange: top.exchange, DeclareExchange: true})
	require.NoError(t, err)
	_, err = ferryrabbit.NewSource(testContext(t), &ferryrabbit.SourceConfig{URL: testURL(t), Queue: top.queue, DeclareQueue: true, Exchange: top.exchange, QueueType: "classic"})
	require.ErrorContains(t, err, "exists with other arguments")
	// It exists now: without DeclareQueue it is used as it is.
	_, err = ferryrabbit.NewSource(testContext(t), &ferryrabbit.SourceConfig{URL: testURL(t), Queue: top.queue})
	require.NoError(t, err)
}

func TestNewSourceValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   ferryrabbit.SourceConfig
		field string
	}{
		{"no queue", ferryrabbit.SourceConfig{}, "SourceConfig.Queue"},
		{"bad URL", ferryrabbit.SourceConfig{Queue: "q", URL: "nats://localhost"}, "SourceConfig.URL"},
		{"reserved queue", ferryrabbit.SourceConfig{Queue: "amq.q", DeclareQueue: true}, `"amq."`},
		{"queue type", ferryrabbit.SourceConfig{Queue: "q", DeclareQueue: true, QueueType: "stream"}, "SourceConfig.QueueType"},
		{"batch", ferryrabbit.SourceConfig{Queue: "q", Batch: 70000}, "SourceConfig.Batch"},
		{"retry", ferryrabbit.SourceConfig{Queue: "q", RetryBase: time.Second, RetryMax: time.Millisecond}, "SourceConfig.RetryMax"},
		{"recovery", ferryrabbit.SourceConfig{Queue: "q", AMQP: &amqp.Config{Recovery: &amqp.Recovery{}}}, "SourceConfig.AMQP.Recovery"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ferryrabbit.NewSource(context.Background(), &tc.cfg)
			require.ErrorContains(t, err, tc.field)
		})
	}
}
