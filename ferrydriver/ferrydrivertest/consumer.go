package ferrydrivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"strconv"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ConsumerHarness adapts a backend to the consumer part of the suite,
// which runs a ferry.Consumer over the backend's inbox.
type ConsumerHarness[TTx any] struct {
	// New returns a driver over a fresh, migrated, isolated namespace.
	New func(t *testing.T) InboxDriver[TTx]
	// Unmigrated returns a driver over a namespace without Ferry's tables,
	// for backends that report ErrSchemaMissing (nil: the test says so and
	// checks nothing).
	Unmigrated func(t *testing.T) InboxDriver[TTx]
	// Effects prepares, in drv's database, a place for handlers' effects:
	// record writes one for ev inside tx, the handler's transaction, and
	// counts reads how many committed effects each event has.
	Effects func(t *testing.T, drv InboxDriver[TTx]) (record func(ctx context.Context, tx TTx, ev *ferryevent.Event) error, counts func(ctx context.Context) (map[uuid.UUID]int, error))

	batch      int  // ConsumerConfig.BatchSize of the run
	savepoints bool // ConsumerConfig.SavepointEach of the run
}

// ExerciseConsumer runs a ferry.Consumer over the backend: its lifecycle
// (a graceful stop, handlers cancelled after the grace period, fatal
// errors returned, one Run at a time), an attempt that outlived its claim
// meeting a later one, and events nobody handles.
//
// Every test runs three times: one event per transaction (BatchSize 1),
// and in batches (BatchSize 32; a backend without ferrydriver.InboxBatcher
// runs one per transaction then too), with savepoints on failure (the
// default) and always.
func ExerciseConsumer[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	for _, mode := range []struct {
		name       string
		batch      int
		savepoints bool
	}{{"BatchSize1", 1, false}, {"BatchSize32", 32, false}, {"BatchSize32SavepointEach", 32, true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			h := h
			h.batch, h.savepoints = mode.batch, mode.savepoints
			t.Run("StopLetsRunningHandlersFinish", func(t *testing.T) { t.Parallel(); testConsumerGracefulStop(t, h) })
			t.Run("StopCancelsHandlersAfterTheGracePeriod", func(t *testing.T) { t.Parallel(); testConsumerCancelledStop(t, h) })
			t.Run("RunReturnsWhatRetryingCannotFix", func(t *testing.T) { t.Parallel(); testConsumerFatal(t, h) })
			t.Run("RunsOnceAtATime", func(t *testing.T) { t.Parallel(); testConsumerOnce(t, h) })
			t.Run("StaleAttemptDoesNotUndoALaterOne", func(t *testing.T) { t.Parallel(); testConsumerStaleAttempt(t, h) })
			t.Run("UnhandledTypesFailUnlessSkipped", func(t *testing.T) { t.Parallel(); testConsumerUnhandled(t, h) })
			t.Run("ExactlyOnceInKeyOrder", func(t *testing.T) { t.Parallel(); testConsumerExactlyOnce(t, h) })
			t.Run("OnePoisonEventCostsOnlyItself", func(t *testing.T) { t.Parallel(); testConsumerPoison(t, h) })
			t.Run("BatchHandlerFailureStaysTheFailingEvents", func(t *testing.T) { t.Parallel(); testConsumerBatchHandler(t, h) })
			t.Run("HandlerOutlivingTheDeadlineCostsOnlyItsEvent", func(t *testing.T) { t.Parallel(); testConsumerDeadlineInBatch(t, h) })
			t.Run("SlowHandlersMakeSmallBatches", func(t *testing.T) { t.Parallel(); testConsumerSlowBatch(t, h) })
			t.Run("AKeysRunStopsAtAFailure", func(t *testing.T) { t.Parallel(); testConsumerRuns(t, h, false) })
			t.Run("BatchHandlerCallsTakeOneEventPerKey", func(t *testing.T) { t.Parallel(); testConsumerRuns(t, h, true) })
			t.Run("FerrytestConsumerAppliesOnce", func(t *testing.T) { t.Parallel(); testFerrytestConsumer(t, h) })
		})
	}
}

// running is a Consumer.Run in progress.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

func run[TTx any](c *ferry.Consumer[TTx]) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	return r
}

// stop cancels the Run and returns its result; a Run that does not return
// within a minute (a generous bound for a loaded machine) fails the test.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

func (r *running) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("Consumer.Run did not return within a minute")
		return nil
	}
}

func newConsumer[TTx any](t *testing.T, h ConsumerHarness[TTx], d InboxDriver[TTx], cfg ferry.ConsumerConfig) *ferry.Consumer[TTx] {
	t.Helper()
	if cfg.BatchSize == 0 {
		cfg.BatchSize = h.batch
	}
	cfg.SavepointEach = cfg.SavepointEach || h.savepoints
	if cfg.Group == "" {
		cfg.Group = group
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase, cfg.RetryMax = 20*time.Millisecond, 100*time.Millisecond
	}
	c, err := ferry.NewConsumer(d, &cfg)
	require.NoError(t, err)
	return c
}

// settle waits until the events named dead are DEAD and every other event
// of evs is PROCESSED, stops r, and requires that each processed event was
// applied once, with one attempt, and each dead one not at all. It returns
// the dead events' rows.
func settle[TTx any](ctx context.Context, t *testing.T, d InboxDriver[TTx], r *running,
	counts func(context.Context) (map[uuid.UUID]int, error), evs []*ferryevent.Event, dead ...uuid.UUID) map[uuid.UUID]*ferrydriver.InboxRow {
	t.Helper()
	for _, id := range dead {
		awaitState(ctx, t, d, id, ferrydriver.InboxDead)
	}
	for _, ev := range evs {
		if !slices.Contains(dead, ev.ID) {
			awaitState(ctx, t, d, ev.ID, ferrydriver.InboxProcessed)
		}
	}
	require.NoError(t, r.stop(t))
	got, err := counts(ctx)
	require.NoError(t, err)
	rows := map[uuid.UUID]*ferrydriver.InboxRow{}
	for _, ev := range evs {
		row := state(ctx, t, d, ev.ID)
		if slices.Contains(dead, ev.ID) {
			require.Zero(t, got[ev.ID], "event %s: the failing handler's writes were rolled back", ev.ID)
			rows[ev.ID] = row
			continue
		}
		require.Equal(t, 1, got[ev.ID], "event %s applied once", ev.ID)
		require.Equal(t, 1, row.Attempts, "event %s cost one attempt", ev.ID)
	}
	return rows
}

func state[TTx any](ctx context.Context, t *testing.T, d InboxDriver[TTx], id uuid.UUID) *ferrydriver.InboxRow {
	t.Helper()
	st, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{id}})
	require.NoError(t, err)
	require.Contains(t, st, id)
	return st[id]
}

func awaitState[TTx any](ctx context.Context, t *testing.T, d InboxDriver[TTx], id uuid.UUID, want ferrydriver.InboxState) *ferrydriver.InboxRow {
	t.Helper()
	var row *ferrydriver.InboxRow
	if !assert.Eventually(t, func() bool { row = state(ctx, t, d, id); return row.State == want }, 30*time.Second, 10*time.Millisecond,
		"event %s never became %s", id, want) {
		// Where it stopped says which part of the consumer did not move.
		t.Fatalf("event %s stayed %s: %d attempt(s), last error %q, next attempt at %v, received at %v",
			id, row.State, row.Attempts, row.LastError, row.NextAttemptAt, row.ReceivedAt)
	}
	return row
}

// testConsumerGracefulStop: a handler running when the stop comes
// finishes and commits, within ShutdownTimeout, and Run returns nil.
func testConsumerGracefulStop[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, 2*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	c := newConsumer(t, h, d, ferry.ConsumerConfig{ShutdownTimeout: 20 * time.Second})
	started := make(chan struct{})
	c.HandleAll(func(ctx context.Context, tx TTx, ev *ferryevent.Event) error {
		close(started)
		time.Sleep(300 * time.Millisecond) // still running when the stop comes
		return record(ctx, tx, ev)
	})
	r := run(c)
	ev := Event("t", "k", "slow")
	_, err := c.Ingest(ctx, []*ferryevent.Event{ev})
	require.NoError(t, err)
	<-started
	require.NoError(t, r.stop(t))
	got, err := counts(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, got[ev.ID], "the running handler finished and committed before Run returned")
	require.Equal(t, ferrydriver.InboxProcessed, state(ctx, t, d, ev.ID).State)
}

// testConsumerCancelledStop: a handler still running when the last
// quarter of ShutdownTimeout begins sees its context cancelled; its
// transaction rolls back, Run returns nil, and the next Run applies the
// event once.
func testConsumerCancelledStop[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, 2*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	var cancelled atomic.Bool
	started := make(chan struct{}, 1)
	handler := func(block bool) ferry.HandlerFunc[TTx] {
		return func(ctx context.Context, tx TTx, ev *ferryevent.Event) error {
			if err := record(ctx, tx, ev); err != nil {
				return err
			}
			if !block {
				return nil
			}
			started <- struct{}{}
			<-ctx.Done() // until the consumer cancels it
			cancelled.Store(true)
			return ctx.Err()
		}
	}
	c := newConsumer(t, h, d, ferry.ConsumerConfig{ShutdownTimeout: time.Second, ClaimTTL: time.Minute})
	c.HandleAll(handler(true))
	r := run(c)
	ev := Event("t", "k", "blocks")
	_, err := c.Ingest(ctx, []*ferryevent.Event{ev})
	require.NoError(t, err)
	<-started
	require.NoError(t, r.stop(t))
	require.True(t, cancelled.Load(), "the handler's context was cancelled")
	got, err := counts(ctx)
	require.NoError(t, err)
	require.Zero(t, got[ev.ID], "the cancelled handler's transaction rolled back")
	row := state(ctx, t, d, ev.ID)
	require.Equal(t, ferrydriver.InboxFailed, row.State, "the cancelled attempt is a failure that retries")
	require.Contains(t, row.LastError, context.Canceled.Error())

	again := newConsumer(t, h, d, ferry.ConsumerConfig{})
	again.HandleAll(handler(false))
	r = run(again)
	awaitState(ctx, t, d, ev.ID, ferrydriver.InboxProcessed)
	require.NoError(t, r.stop(t))
	got, err = counts(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, got[ev.ID], "applied once, by the next run")
}

// testConsumerFatal: Run returns a missing schema instead of retrying it
// forever.
func testConsumerFatal[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	if h.Unmigrated == nil {
		t.Log("the backend creates its collections on first use: no missing schema to report")
		return
	}
	c := newConsumer(t, h, h.Unmigrated(t), ferry.ConsumerConfig{})
	r := run(c)
	err := r.wait(t)
	require.ErrorIs(t, err, ferrydriver.ErrSchemaMissing)
	require.Contains(t, err.Error(), group, "the error names the group")
}

// testConsumerOnce: a second Run of a running consumer is refused at once;
// after the first returned, the consumer runs again.
func testConsumerOnce[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, time.Minute)
	d := h.New(t)
	c := newConsumer(t, h, d, ferry.ConsumerConfig{})
	var handled atomic.Int32
	c.HandleAll(func(context.Context, TTx, *ferryevent.Event) error { handled.Add(1); return nil })
	r := run(c)
	ev := Event("t", "k", "one")
	_, err := c.Ingest(ctx, []*ferryevent.Event{ev})
	require.NoError(t, err)
	awaitState(ctx, t, d, ev.ID, ferrydriver.InboxProcessed)
	require.ErrorContains(t, c.Run(ctx), "already running")
	require.NoError(t, r.stop(t))
	r = run(c)
	ev2 := Event("t", "k", "two")
	_, err = c.Ingest(ctx, []*ferryevent.Event{ev2})
	require.NoError(t, err)
	awaitState(ctx, t, d, ev2.ID, ferrydriver.InboxProcessed)
	require.NoError(t, r.stop(t))
	require.Equal(t, int32(2), handled.Load())
}

// testConsumerStaleAttempt: attempt 1 outlives its claim and fails late,
// after attempt 2 (same process) started; attempt 2 succeeds. The event is
// processed once, with two attempts recorded, and never DEAD.
func testConsumerStaleAttempt[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, 2*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	var deaths, attempts atomic.Int32
	c := newConsumer(t, h, d, ferry.ConsumerConfig{Workers: 4, ClaimTTL: time.Second, MaxAttempts: 2,
		OnDead: func(context.Context, *ferry.DeadEvent) { deaths.Add(1) }})
	lateFailure := make(chan struct{})
	c.HandleAll(func(ctx context.Context, tx TTx, ev *ferryevent.Event) error {
		if attempts.Add(1) == 1 {
			time.Sleep(2500 * time.Millisecond) // ignores its deadline, past the claim and the rescue's wait
			defer close(lateFailure)
			return errors.New("late failure of attempt 1")
		}
		return record(ctx, tx, ev)
	})
	r := run(c)
	defer func() { require.NoError(t, r.stop(t)) }()
	ev := Event("t", "k", "stale")
	_, err := c.Ingest(ctx, []*ferryevent.Event{ev})
	require.NoError(t, err)
	<-lateFailure
	awaitState(ctx, t, d, ev.ID, ferrydriver.InboxProcessed)
	time.Sleep(300 * time.Millisecond) // anything late would land now
	row := state(ctx, t, d, ev.ID)
	require.Equal(t, ferrydriver.InboxProcessed, row.State)
	require.Equal(t, 2, row.Attempts, "two attempts recorded")
	got, err := counts(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, got[ev.ID], "processed once")
	require.Equal(t, int32(2), attempts.Load())
	require.Zero(t, deaths.Load(), "never DEAD")
}

// testConsumerUnhandled: an event of a type without a handler fails,
// naming the type, and goes DEAD after MaxAttempts; with SkipUnhandled it
// is marked processed without a handler.
func testConsumerUnhandled[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, time.Minute)
	d := h.New(t)
	c := newConsumer(t, h, d, ferry.ConsumerConfig{MaxAttempts: 2})
	ferry.Handle(c, "Known", func(context.Context, TTx, *ferryevent.Event, struct{}) error { return nil })
	r := run(c)
	ev := Event("t", "k", "{}")
	ev.Type = "BrandNew"
	_, err := c.Ingest(ctx, []*ferryevent.Event{ev})
	require.NoError(t, err)
	row := awaitState(ctx, t, d, ev.ID, ferrydriver.InboxDead)
	require.NoError(t, r.stop(t))
	require.Equal(t, 2, row.Attempts)
	require.Contains(t, row.LastError, `no handler for event type "BrandNew"`)

	skip := newConsumer(t, h, d, ferry.ConsumerConfig{Group: "skips", SkipUnhandled: true})
	ferry.Handle(skip, "Known", func(context.Context, TTx, *ferryevent.Event, struct{}) error { return nil })
	r = run(skip)
	_, err = skip.Ingest(ctx, []*ferryevent.Event{ev})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: "skips", EventIDs: []uuid.UUID{ev.ID}})
		require.NoError(t, err)
		return st[ev.ID] != nil && st[ev.ID].State == ferrydriver.InboxProcessed
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, r.stop(t))
}

// testConsumerExactlyOnce: 1,000 events over 50 keys, each delivered
// twice, with handlers that fail now and then: every event applied once,
// every key in order.
func testConsumerExactlyOnce[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, 5*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	c := newConsumer(t, h, d, ferry.ConsumerConfig{Workers: 4})
	var mu sync.Mutex
	order := map[string][]int64{}
	var failures atomic.Int32
	c.HandleAll(func(ctx context.Context, tx TTx, ev *ferryevent.Event) error {
		if ev.Seq%97 == 0 && failures.Add(1)%2 == 1 {
			return errors.New("flaky") // the retry applies it
		}
		if err := record(ctx, tx, ev); err != nil {
			return err
		}
		mu.Lock()
		order[ev.Key] = append(order[ev.Key], ev.Seq)
		mu.Unlock()
		return nil
	})
	const n, keys = 1000, 50
	evs := make([]*ferryevent.Event, n)
	for i := range evs {
		evs[i] = Event("t", fmt.Sprintf("k%02d", i%keys), strconv.Itoa(i))
		evs[i].Seq = int64(i/keys + 1)
	}
	r := run(c)
	for _, copy := range []int{0, 1} {
		for i := 0; i < n; i += 100 {
			_, err := c.Ingest(ctx, evs[i:i+100])
			require.NoError(t, err, "delivery %d", copy)
		}
	}
	// A liveness bound, not a measurement: 2,000 deliveries, one
	// transaction each at BatchSize 1, beside the suite's other tests, under
	// the race detector, on SQLite's one writer (65 s on a loaded CI run).
	require.Eventually(t, func() bool {
		got, err := counts(ctx)
		require.NoError(t, err)
		return len(got) == n
	}, 4*time.Minute, 20*time.Millisecond)
	require.NoError(t, r.stop(t))
	got, err := counts(ctx)
	require.NoError(t, err)
	for _, ev := range evs {
		require.Equal(t, 1, got[ev.ID], "event %s applied once", ev.ID)
	}
	for k, seqs := range order {
		committed := committedOrder(seqs)
		require.True(t, slices.IsSorted(committed), "key %s ran out of order: %v", k, committed)
		require.Len(t, committed, n/keys, "key %s", k)
	}
}

// committedOrder is what handler calls of a key's events (their Seqs, in
// call order) left once the calls that rolled back are taken out: a call
// for an event that was called before means that its earlier call, and
// every call after it, rolled back (an attempt that failed or lost its
// claim, a batch run again with savepoints). Whether what is left was
// applied once is for the effects to tell.
func committedOrder(seqs []int64) []int64 {
	var out []int64
	for _, s := range seqs {
		if i := slices.Index(out, s); i >= 0 {
			out = out[:i]
		}
		out = append(out, s)
	}
	return out
}

// testConsumerPoison: one poison event among 100 of different keys, run
// in one batch when batching: the other 99 are applied once, with one
// attempt each; the poison event retries, then goes DEAD; a panicking
// handler is a failure like any other.
func testConsumerPoison[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, 2*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	var dead atomic.Int32
	batch := 1
	if h.batch > 1 {
		batch = 64 // all 100 in two batches
	}
	c := newConsumer(t, h, d, ferry.ConsumerConfig{Workers: 1, MaxAttempts: 2, BatchSize: batch,
		OnDead: func(context.Context, *ferry.DeadEvent) { dead.Add(1) }})
	evs := make([]*ferryevent.Event, 100)
	for i := range evs {
		evs[i] = Event("t", fmt.Sprintf("k%03d", i), strconv.Itoa(i))
	}
	poison, panics := evs[17].ID, evs[42].ID
	c.HandleAll(func(ctx context.Context, tx TTx, ev *ferryevent.Event) error {
		if err := record(ctx, tx, ev); err != nil {
			return err
		}
		switch ev.ID {
		case poison:
			return errors.New("poison")
		case panics:
			panic("handler bug")
		}
		return nil
	})
	_, err := c.Ingest(ctx, evs) // before Run: claimed together
	require.NoError(t, err)
	deadRows := settle(ctx, t, d, run(c), counts, evs, poison, panics)
	require.Equal(t, 2, deadRows[poison].Attempts)
	require.Equal(t, 2, deadRows[panics].Attempts)
	require.Contains(t, deadRows[panics].LastError, "handler panicked: handler bug")
	require.Equal(t, int32(2), dead.Load())
}
