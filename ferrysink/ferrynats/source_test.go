package ferrynats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
)

const testDurable = "billing"

// sourceStream creates a fresh stream and a sink publishing to it.
func sourceStream(t *testing.T) (sink *ferrynats.Sink, stream, prefix string) {
	t.Helper()
	stream, prefix = testNames(t)
	sink, err := ferrynats.New(testContext(t), testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sink.Close(context.Background())) })
	return sink, stream, prefix
}

// publishKeyed publishes perKey events for each key, with Seq 1..perKey.
// Each call holds one event per key, as the relay's do, so that a key's
// events are stored in Seq order.
func publishKeyed(t *testing.T, sink *ferrynats.Sink, keys []string, perKey int) []*ferryevent.Event {
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

func newSource(t *testing.T, stream, prefix string, cfg ferrynats.SourceConfig) *ferrynats.Source {
	t.Helper()
	cfg.Stream, cfg.SubjectPrefix = stream, prefix
	if cfg.Durable == "" {
		cfg.Durable = testDurable
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	src, err := ferrynats.NewSource(testContext(t), testJetStream(t), &cfg)
	require.NoError(t, err)
	return src
}

func consumerInfo(t *testing.T, stream string) *jetstream.ConsumerInfo {
	t.Helper()
	info, err := readConsumerInfo(testContext(t), testJetStream(t), stream)
	require.NoError(t, err)
	return info
}

// readConsumerInfo is consumerInfo for ingest functions, which run on
// Run's goroutine and so may not call t.FailNow.
func readConsumerInfo(ctx context.Context, js jetstream.JetStream, stream string) (*jetstream.ConsumerInfo, error) {
	cons, err := js.Consumer(ctx, stream, testDurable)
	if err != nil {
		return nil, err
	}
	return cons.Info(ctx)
}

// recorder is an ingest function standing in for a consumer's inbox: it
// keeps every call and the first delivery of each event.
type recorder struct {
	// fail, when set, is called before an ingest is recorded; a non-nil
	// result fails the call. call counts from 0.
	fail func(ctx context.Context, call int, events []*ferryevent.Event) error
	// after, when set, is called after a successful ingest.
	after func(call int)

	mu    sync.Mutex
	calls [][]uuid.UUID // IDs passed to each call, failed ones included
	seen  map[uuid.UUID]bool
	inbox []*ferryevent.Event // first deliveries, in ingest order
	want  int
	done  chan struct{} // closed once want events are in inbox
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
	r.mu.Unlock()
	if r.after != nil {
		r.after(call)
	}
	return nil
}

func (r *recorder) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(8 * time.Second):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("ingested %d events of %d in %d calls", len(r.inbox), r.want, len(r.calls))
	}
}

func (r *recorder) snapshot() (calls [][]uuid.UUID, inbox []*ferryevent.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls), slices.Clone(r.inbox)
}

// running is a Source.Run in a goroutine.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, src *ferrynats.Source, ingest func(context.Context, []*ferryevent.Event) error) *running {
	t.Helper()
	return startCtx(t, context.Background(), src, ingest)
}

// startCtx is start with a context the test may cancel from ingest.
func startCtx(t *testing.T, ctx context.Context, src *ferrynats.Source, ingest func(context.Context, []*ferryevent.Event) error) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- src.Run(ctx, ingest) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
			t.Error("Source.Run did not return within 5 s of its context ending")
		}
	})
	return r
}

// stop cancels Run and returns its result.
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

func TestSourceDeliversInKeyOrder(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	keys := []string{"a", "b", "c", "d"}
	published := publishKeyed(t, sink, keys, 50)

	src := newSource(t, stream, prefix, ferrynats.SourceConfig{Batch: 16})
	rec := newRecorder(len(published))
	run := start(t, src, rec.ingest)
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
	// The payload and attributes survive the trip.
	require.Equal(t, published[0].Payload, inbox[0].Payload)
	require.Equal(t, published[0].ID, inbox[0].ID)

	info := consumerInfo(t, stream)
	require.Zero(t, info.NumAckPending)
	require.Zero(t, info.NumPending)
	require.Equal(t, uint64(len(published)), info.AckFloor.Stream)
}

func TestSourceRetriesTheSameBatch(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	keys := []string{"a", "b", "c"}
	publishKeyed(t, sink, keys, 10)

	const failures = 3
	js := testJetStream(t)
	var during []*jetstream.ConsumerInfo // written by Run's goroutine, read after it returned
	rec := newRecorder(30)
	rec.fail = func(ctx context.Context, call int, _ []*ferryevent.Event) error {
		if call >= failures {
			return nil
		}
		if call > 0 {
			info, err := readConsumerInfo(ctx, js, stream)
			if err != nil {
				return err
			}
			during = append(during, info)
		}
		return errors.New("inbox unavailable")
	}
	src := newSource(t, stream, prefix, ferrynats.SourceConfig{Batch: 8, RetryBase: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	run := start(t, src, rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))

	calls, inbox := rec.snapshot()
	for i := 1; i <= failures; i++ {
		require.Equal(t, calls[0], calls[i], "call %d did not retry the failed batch", i)
	}
	require.Len(t, calls[0], 8)
	require.Len(t, during, failures-1)
	for _, info := range during {
		require.Equal(t, 8, info.NumAckPending, "the failing batch is pending")
		require.Zero(t, info.AckFloor.Stream, "nothing is acknowledged while ingest fails")
		require.Equal(t, uint64(8), info.Delivered.Consumer, "nothing else is fetched while ingest fails")
	}
	requireKeyOrder(t, inbox, keys, 10)
}

func TestSourceExtendsTheFailingBatch(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	publishKeyed(t, sink, []string{"a"}, 5)

	// Ingest fails for longer than the ack wait. Then, before it succeeds,
	// another pull on the durable must find nothing: had the batch's
	// deadline passed, JetStream would hand it out again.
	src := newSource(t, stream, prefix, ferrynats.SourceConfig{AckWait: time.Second, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	cons, err := testJetStream(t).Consumer(testContext(t), stream, testDurable)
	require.NoError(t, err)
	var (
		first  time.Time
		stolen = -1 // written by Run's goroutine, read after it returned
	)
	rec := newRecorder(5)
	rec.fail = func(ctx context.Context, call int, _ []*ferryevent.Event) error {
		if call == 0 {
			first = time.Now()
		}
		if time.Since(first) < 1500*time.Millisecond {
			return errors.New("inbox unavailable")
		}
		batch, err := cons.FetchNoWait(10)
		if err != nil {
			return err
		}
		stolen = 0
		for range batch.Messages() {
			stolen++
		}
		return batch.Error()
	}
	run := start(t, src, rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))
	_, inbox := rec.snapshot()
	requireKeyOrder(t, inbox, []string{"a"}, 5)
	require.Zero(t, stolen, "JetStream handed out the held batch again")
	info := consumerInfo(t, stream)
	require.Equal(t, uint64(5), info.Delivered.Consumer)
	require.Zero(t, info.NumAckPending)
}

func TestSourceTerminatesInvalidMessages(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	js := testJetStream(t)
	ctx := testContext(t)
	publishKeyed(t, sink, []string{"a"}, 3)
	// Not a Ferry event at all, then one with a broken attribute.
	_, err := js.Publish(ctx, prefix+".orders", []byte("garbage"))
	require.NoError(t, err)
	bad := nats.NewMsg(prefix + ".orders")
	bad.Header.Set("ce-specversion", "1.0")
	bad.Header.Set("ce-id", "not-a-uuid")
	_, err = js.PublishMsg(ctx, bad)
	require.NoError(t, err)
	publishKeyed(t, sink, []string{"b"}, 3)

	type invalid struct {
		seq uint64
		err error
	}
	var (
		mu       sync.Mutex
		invalids []invalid
	)
	src := newSource(t, stream, prefix, ferrynats.SourceConfig{
		Batch: 4,
		OnInvalid: func(ctx context.Context, msg jetstream.Msg, err error) {
			var seq uint64
			if md, err := msg.Metadata(); err == nil {
				seq = md.Sequence.Stream
			}
			mu.Lock()
			invalids = append(invalids, invalid{seq, err})
			mu.Unlock()
		},
	})
	rec := newRecorder(6) // a:1..3, b:1..3
	run := start(t, src, rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))

	_, inbox := rec.snapshot()
	requireKeyOrder(t, inbox, []string{"a", "b"}, 3)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, invalids, 2)
	require.Equal(t, uint64(4), invalids[0].seq)
	require.Equal(t, uint64(5), invalids[1].seq)
	for _, inv := range invalids {
		require.ErrorIs(t, inv.err, ferrynats.ErrMalformed)
	}
	// Terminated: no longer pending, never delivered again.
	info := consumerInfo(t, stream)
	require.Zero(t, info.NumAckPending)
	require.Equal(t, uint64(8), info.AckFloor.Stream)
}

func TestSourceLogsInvalidMessagesByDefault(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	_, err := testJetStream(t).Publish(testContext(t), prefix+".orders", []byte("garbage"))
	require.NoError(t, err)
	publishKeyed(t, sink, []string{"a"}, 1)

	var logs bytes.Buffer // written by Run's goroutine, read after it returned
	src := newSource(t, stream, prefix, ferrynats.SourceConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	rec := newRecorder(1)
	run := start(t, src, rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))
	require.Contains(t, logs.String(), "not a Ferry event")
	require.Contains(t, logs.String(), "subject="+prefix+".orders")
	require.Contains(t, logs.String(), "stream_seq=1")
	require.Zero(t, consumerInfo(t, stream).NumAckPending)
}

func TestSourceRestartResumesAfterAcknowledged(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	keys := []string{"a", "b"}
	publishKeyed(t, sink, keys, 20)
	cfg := ferrynats.SourceConfig{Batch: 10}

	// The first run stops right after its second batch was ingested.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := newRecorder(0)
	first.after = func(call int) {
		if call == 1 {
			cancel()
		}
	}
	run := startCtx(t, ctx, newSource(t, stream, prefix, cfg), first.ingest)
	require.NoError(t, run.wait(t))
	calls, inbox1 := first.snapshot()
	require.Len(t, calls, 2)
	require.Len(t, inbox1, 20)
	info := consumerInfo(t, stream)
	require.Zero(t, info.NumAckPending, "the ingested batch is acknowledged although the context ended")
	require.Equal(t, uint64(20), info.AckFloor.Stream)

	second := newRecorder(20)
	run2 := start(t, newSource(t, stream, prefix, cfg), second.ingest)
	second.wait(t)
	require.NoError(t, run2.stop(t))
	calls2, inbox2 := second.snapshot()
	delivered := 0
	for _, c := range calls2 {
		delivered += len(c)
	}
	require.Equal(t, 20, delivered, "the second run received an acknowledged event again")
	requireKeyOrder(t, append(inbox1, inbox2...), keys, 20)
}

func TestSourceRestartRedeliversUnacknowledgedFirst(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	keys := []string{"a", "b"}
	publishKeyed(t, sink, keys, 20)
	// A long ack wait: the second run may not wait for it.
	cfg := ferrynats.SourceConfig{Batch: 10, AckWait: time.Minute, RetryBase: time.Hour, RetryMax: time.Hour}

	// The first run ingests one batch, then stops while the next fails.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := newRecorder(0)
	first.fail = func(ctx context.Context, call int, _ []*ferryevent.Event) error {
		if call == 0 {
			return nil
		}
		cancel()
		return ctx.Err()
	}
	run := startCtx(t, ctx, newSource(t, stream, prefix, cfg), first.ingest)
	require.NoError(t, run.wait(t))
	_, inbox1 := first.snapshot()
	require.Len(t, inbox1, 10)

	second := newRecorder(30)
	run2 := start(t, newSource(t, stream, prefix, cfg), second.ingest)
	second.wait(t)
	require.NoError(t, run2.stop(t))
	_, inbox2 := second.snapshot()
	requireKeyOrder(t, append(inbox1, inbox2...), keys, 20)
}

func TestSourceKeepsOrderAfterACrash(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	publishKeyed(t, sink, []string{"a"}, 15)
	src := newSource(t, stream, prefix, ferrynats.SourceConfig{Batch: 4, AckWait: time.Second})

	// A process took the first five messages and died without a word:
	// JetStream delivers them again only after the ack wait, while the
	// later ones are available at once.
	cons, err := testJetStream(t).Consumer(testContext(t), stream, testDurable)
	require.NoError(t, err)
	batch, err := cons.Fetch(5, jetstream.FetchMaxWait(time.Second))
	require.NoError(t, err)
	taken := 0
	for range batch.Messages() {
		taken++
	}
	require.NoError(t, batch.Error())
	require.Equal(t, 5, taken)

	rec := newRecorder(15)
	run := start(t, src, rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))
	_, inbox := rec.snapshot()
	requireKeyOrder(t, inbox, []string{"a"}, 15)
}

func TestSourceKeepsOrderWhenDeliveriesGoElsewhere(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	publishKeyed(t, sink, []string{"a"}, 15)
	src := newSource(t, stream, prefix, ferrynats.SourceConfig{Batch: 4, AckWait: time.Second})
	cons, err := testJetStream(t).Consumer(testContext(t), stream, testDurable)
	require.NoError(t, err)

	// While the first batch is ingested, someone else takes the next
	// three messages from the durable and never acknowledges them.
	rec := newRecorder(15)
	rec.fail = func(ctx context.Context, call int, _ []*ferryevent.Event) error {
		if call != 0 {
			return nil
		}
		batch, err := cons.Fetch(3, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		for range batch.Messages() {
		}
		return batch.Error()
	}
	run := start(t, src, rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))
	_, inbox := rec.snapshot()
	requireKeyOrder(t, inbox, []string{"a"}, 15)
}

func TestSourceStopsPromptly(t *testing.T) {
	t.Parallel()

	t.Run("waiting for messages", func(t *testing.T) {
		t.Parallel()
		_, stream, prefix := sourceStream(t)
		src := newSource(t, stream, prefix, ferrynats.SourceConfig{MaxWait: time.Minute, AckWait: 2 * time.Minute})
		run := start(t, src, newRecorder(0).ingest)
		require.Eventually(t, func() bool { return consumerInfo(t, stream).NumWaiting > 0 }, 5*time.Second, 10*time.Millisecond)
		began := time.Now()
		require.NoError(t, run.stop(t))
		require.Less(t, time.Since(began), time.Second)
	})

	t.Run("backing off", func(t *testing.T) {
		t.Parallel()
		sink, stream, prefix := sourceStream(t)
		publishKeyed(t, sink, []string{"a"}, 1)
		src := newSource(t, stream, prefix, ferrynats.SourceConfig{RetryBase: time.Hour, RetryMax: time.Hour})
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
		run := start(t, src, rec.ingest)
		<-failed
		began := time.Now()
		require.NoError(t, run.stop(t))
		require.Less(t, time.Since(began), time.Second)
		require.Zero(t, consumerInfo(t, stream).AckFloor.Stream)
	})
}

func TestSourceDurableDeleted(t *testing.T) {
	t.Parallel()
	_, stream, prefix := sourceStream(t)
	src := newSource(t, stream, prefix, ferrynats.SourceConfig{})
	run := start(t, src, newRecorder(0).ingest)
	require.Eventually(t, func() bool { return consumerInfo(t, stream).NumWaiting > 0 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, testJetStream(t).DeleteConsumer(testContext(t), stream, testDurable))
	err := run.wait(t)
	require.ErrorIs(t, err, jetstream.ErrConsumerDeleted)
	require.ErrorContains(t, err, `durable consumer "`+testDurable+`"`)
	require.ErrorContains(t, err, "NewSource")
}

func TestSourceRunTwice(t *testing.T) {
	t.Parallel()
	_, stream, prefix := sourceStream(t)
	src := newSource(t, stream, prefix, ferrynats.SourceConfig{})
	run := start(t, src, newRecorder(0).ingest)
	require.Eventually(t, func() bool { return consumerInfo(t, stream).NumWaiting > 0 }, 5*time.Second, 10*time.Millisecond)
	require.ErrorContains(t, src.Run(testContext(t), newRecorder(0).ingest), "already running")
	require.NoError(t, run.stop(t))
	require.ErrorContains(t, src.Run(testContext(t), nil), "ingest function")
}

func TestNewSourceConfiguresTheDurable(t *testing.T) {
	t.Parallel()
	_, stream, prefix := sourceStream(t)
	newSource(t, stream, prefix, ferrynats.SourceConfig{Batch: 10})
	info := consumerInfo(t, stream)
	require.Equal(t, testDurable, info.Config.Durable)
	require.Equal(t, jetstream.AckExplicitPolicy, info.Config.AckPolicy)
	require.Equal(t, jetstream.DeliverAllPolicy, info.Config.DeliverPolicy)
	require.Equal(t, prefix+".>", info.Config.FilterSubject)
	require.Equal(t, 40, info.Config.MaxAckPending)
	require.Equal(t, ferrynats.DefaultAckWait, info.Config.AckWait)
	require.Equal(t, -1, info.Config.MaxDeliver)

	// A second NewSource updates it.
	newSource(t, stream, prefix, ferrynats.SourceConfig{Batch: 10, MaxAckPending: 100, AckWait: time.Minute})
	info = consumerInfo(t, stream)
	require.Equal(t, 100, info.Config.MaxAckPending)
	require.Equal(t, time.Minute, info.Config.AckWait)
}

func TestNewSourceFilterSubject(t *testing.T) {
	t.Parallel()
	sink, stream, prefix := sourceStream(t)
	publishKeyed(t, sink, []string{"a"}, 2)
	other := event("invoices", "a")
	for _, err := range sink.Publish(testContext(t), []*ferryevent.Event{other}) {
		require.NoError(t, err)
	}

	src, err := ferrynats.NewSource(testContext(t), testJetStream(t), &ferrynats.SourceConfig{
		Stream: stream, Durable: testDurable, FilterSubject: prefix + ".invoices", MaxWait: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	rec := newRecorder(1)
	run := start(t, src, rec.ingest)
	rec.wait(t)
	require.NoError(t, run.stop(t))
	_, inbox := rec.snapshot()
	require.Len(t, inbox, 1)
	require.Equal(t, other.ID, inbox[0].ID)
}

func TestNewSourceMissingStream(t *testing.T) {
	t.Parallel()
	stream, _ := testNames(t)
	_, err := ferrynats.NewSource(testContext(t), testJetStream(t), &ferrynats.SourceConfig{Stream: stream, Durable: testDurable})
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	require.ErrorContains(t, err, `stream "`+stream+`" not found`)
	require.ErrorContains(t, err, "SourceConfig.Stream")
}

func TestNewSourceStreamDoesNotCaptureFilter(t *testing.T) {
	t.Parallel()
	_, stream, prefix := sourceStream(t)
	_, err := ferrynats.NewSource(testContext(t), testJetStream(t), &ferrynats.SourceConfig{Stream: stream, Durable: testDurable, SubjectPrefix: prefix + "x"})
	require.ErrorContains(t, err, "does not capture")
	require.ErrorContains(t, err, "SourceConfig.SubjectPrefix")
}

func TestNewSourceValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   ferrynats.SourceConfig
		field string
	}{
		{"no durable", ferrynats.SourceConfig{}, "SourceConfig.Durable"},
		{"durable with dot", ferrynats.SourceConfig{Durable: "a.b"}, "SourceConfig.Durable"},
		{"stream with space", ferrynats.SourceConfig{Durable: "d", Stream: "A B"}, "SourceConfig.Stream"},
		{"prefix and filter", ferrynats.SourceConfig{Durable: "d", SubjectPrefix: "a", FilterSubject: "a.>"}, "SourceConfig.FilterSubject"},
		{"prefix with wildcard", ferrynats.SourceConfig{Durable: "d", SubjectPrefix: "a.*"}, "SourceConfig.SubjectPrefix"},
		{"filter with inner >", ferrynats.SourceConfig{Durable: "d", FilterSubject: "a.>.b"}, "SourceConfig.FilterSubject"},
		{"filter with empty token", ferrynats.SourceConfig{Durable: "d", FilterSubject: "a..b"}, "SourceConfig.FilterSubject"},
		{"negative batch", ferrynats.SourceConfig{Durable: "d", Batch: -1}, "SourceConfig.Batch"},
		{"negative wait", ferrynats.SourceConfig{Durable: "d", MaxWait: -time.Second}, "SourceConfig.MaxWait"},
		{"short ack wait", ferrynats.SourceConfig{Durable: "d", AckWait: time.Millisecond}, "SourceConfig.AckWait"},
		{"max ack pending below batch", ferrynats.SourceConfig{Durable: "d", Batch: 10, MaxAckPending: 5}, "SourceConfig.MaxAckPending"},
		{"negative retry", ferrynats.SourceConfig{Durable: "d", RetryBase: -time.Second}, "SourceConfig.RetryBase"},
		{"retry max below base", ferrynats.SourceConfig{Durable: "d", RetryBase: time.Minute, RetryMax: time.Second}, "SourceConfig.RetryMax"},
		{"negative shares", ferrynats.SourceConfig{Durable: "d", Shares: -1}, "SourceConfig.Shares"},
		{"too many shares", ferrynats.SourceConfig{Durable: "d", Shares: ferrynats.MaxShares + 1}, "SourceConfig.Shares"},
		{"shares and filter", ferrynats.SourceConfig{Durable: "d", Shares: 2, FilterSubject: "a.>"}, "SourceConfig.FilterSubject"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The configuration is checked before JetStream is used.
			_, err := ferrynats.NewSource(context.Background(), nil, &tc.cfg)
			require.ErrorContains(t, err, tc.field)
		})
	}

	_, err := ferrynats.NewSource(context.Background(), nil, &ferrynats.SourceConfig{Durable: "d"})
	require.ErrorContains(t, err, "jetstream.New")
}

func TestSourceConfigWithDefaults(t *testing.T) {
	t.Parallel()
	c := (*ferrynats.SourceConfig)(nil).WithDefaults()
	require.Equal(t, ferrynats.DefaultStream, c.Stream)
	require.Equal(t, ferrynats.DefaultSubjectPrefix, c.SubjectPrefix)
	require.Equal(t, ferrynats.DefaultBatch, c.Batch)
	require.Equal(t, 4*ferrynats.DefaultBatch, c.MaxAckPending)
	require.Equal(t, ferrynats.DefaultMaxWait, c.MaxWait)
	require.Equal(t, ferrynats.DefaultAckWait, c.AckWait)
	require.Equal(t, ferrynats.DefaultRetryBase, c.RetryBase)
	require.Equal(t, ferrynats.DefaultRetryMax, c.RetryMax)
	require.NotNil(t, c.Logger)

	c = (&ferrynats.SourceConfig{FilterSubject: "a.>"}).WithDefaults()
	require.Empty(t, c.SubjectPrefix, "a filter replaces the prefix")
}

// TestSharedSinkAndSource: a sink with Config.Shares maps each key to one
// share's subjects, "<prefix>.<share>.<topic>"; a source with as many
// shares reads them through a durable per share ("<durable>-<share>"),
// each key's events from one share, in order; Run reads every share.
func TestSharedSinkAndSource(t *testing.T) {
	t.Parallel()
	stream, prefix := testNames(t)
	sink, err := ferrynats.New(testContext(t), testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true, Shares: 3})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sink.Close(context.Background())) })
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	published := publishKeyed(t, sink, keys, 20)

	shareOf := map[string]string{}
	want := map[string]uint64{}
	for _, k := range keys {
		shareOf[k] = strconv.Itoa(ferrydriver.PartitionOf(k, 3))
		want[prefix+"."+shareOf[k]+".orders"] += 20
	}
	st, err := testJetStream(t).Stream(testContext(t), stream)
	require.NoError(t, err)
	info, err := st.Info(testContext(t), jetstream.WithSubjectFilter(prefix+".>"))
	require.NoError(t, err)
	require.Equal(t, want, info.State.Subjects, "each key's events on its share's subject")

	src := newSource(t, stream, prefix, ferrynats.SourceConfig{Batch: 7, Shares: 3})
	require.Equal(t, 3, src.Shares())
	js := testJetStream(t)
	for i := range 3 {
		c, err := js.Consumer(testContext(t), stream, testDurable+"-"+strconv.Itoa(i))
		require.NoError(t, err)
		require.Equal(t, prefix+"."+strconv.Itoa(i)+".>", c.CachedInfo().Config.FilterSubject)
	}
	// One share alone: only its keys.
	require.ErrorContains(t, src.Run(testContext(t), nil), "ingest function")
	rec := newRecorder(0)
	ctx, cancel := context.WithCancel(testContext(t))
	done := make(chan error, 1)
	go func() { done <- src.RunShare(ctx, 1, rec.ingest) }()
	inShare := 0
	for _, k := range keys {
		if shareOf[k] == "1" {
			inShare += 20
		}
	}
	require.True(t, inShare > 0 && inShare < len(published), "share 1 holds some keys, not all")
	require.Eventually(t, func() bool { _, inbox := rec.snapshot(); return len(inbox) >= inShare }, 30*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	_, inbox := rec.snapshot()
	require.Len(t, inbox, inShare)
	for _, ev := range inbox {
		require.Equal(t, "1", shareOf[ev.Key])
	}
	require.ErrorContains(t, src.RunShare(testContext(t), 3, rec.ingest), "share 3 does not exist")

	// Run reads the rest, every share at once, each key in order.
	all := newRecorder(len(published) - inShare)
	run := start(t, src, all.ingest)
	all.wait(t)
	require.NoError(t, run.stop(t))
	_, rest := all.snapshot()
	var others []string
	for _, k := range keys {
		if shareOf[k] != "1" {
			others = append(others, k)
		}
	}
	requireKeyOrder(t, rest, others, 20)
}

func TestSharedSinkRefusesASubjectFunction(t *testing.T) {
	t.Parallel()
	stream, prefix := testNames(t)
	_, err := ferrynats.New(testContext(t), testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true, Shares: 2,
		Subject: func(*ferryevent.Event) string { return prefix + ".x" }})
	require.ErrorContains(t, err, "Config.Shares and Config.Subject")
	_, err = ferrynats.New(testContext(t), testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true, Shares: -1})
	require.ErrorContains(t, err, "Config.Shares")
}

// TestSharedSourceRefusesAStreamWithMoreShares: a source of two shares on
// a stream that a sink of three publishes to would never read the third
// share's subjects: NewSource refuses and says what to set.
func TestSharedSourceRefusesAStreamWithMoreShares(t *testing.T) {
	t.Parallel()
	stream, prefix := testNames(t)
	sink, err := ferrynats.New(testContext(t), testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true, Shares: 3})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sink.Close(context.Background())) })
	var keys []string
	for i := range 12 {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	publishKeyed(t, sink, keys, 1)
	_, err = ferrynats.NewSource(testContext(t), testJetStream(t), &ferrynats.SourceConfig{Stream: stream, SubjectPrefix: prefix, Durable: testDurable, Shares: 2})
	require.ErrorContains(t, err, "past SourceConfig.Shares (2)")
	require.ErrorContains(t, err, prefix+".2.orders")
	require.ErrorContains(t, err, "--shares")
	_, err = ferrynats.NewSource(testContext(t), testJetStream(t), &ferrynats.SourceConfig{Stream: stream, SubjectPrefix: prefix, Durable: testDurable, Shares: 3})
	require.NoError(t, err, "the sink's count is accepted")
}
