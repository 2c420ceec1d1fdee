// Package ferrydrivertest is the behavioural suite every Ferry backend must
// pass. A backend's tests call Exercise with a Harness that makes fresh,
// isolated, migrated stores on a real server.
//
// The suite branches on ferrydriver.Capabilities explicitly; a capability a
// backend lacks is reported with t.Log, never skipped silently.
package ferrydrivertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryevent/ferryeventtest"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// Harness adapts a backend to the suite.
type Harness[TTx any] struct {
	// New returns a driver over a fresh, migrated, isolated namespace
	// (schema, database) that is removed when the test ends.
	New func(t *testing.T) ferrydriver.Driver[TTx]
	// Begin starts a caller transaction on drv's database.
	Begin func(ctx context.Context, t *testing.T, drv ferrydriver.Driver[TTx]) Tx[TTx]
	// HoldWriter starts a write transaction that touches nothing of Ferry's
	// and keeps it open until the returned function is called. Required
	// when Capabilities().ConcurrentWriters.
	HoldWriter func(ctx context.Context, t *testing.T) (end func())
	// LongWriterHold is how long TestLongWriterDoesNotStall keeps the
	// foreign transaction open; default 10 s.
	LongWriterHold time.Duration
	// Retryable is set for backends whose writers of one key abort with an
	// error instead of waiting for each other (MongoDB's WriteConflict):
	// it reports an error after which the transaction is run again. The
	// ordering tests then check the abort-and-retry form.
	Retryable func(error) bool
	// NewPartitioned returns a driver over a fresh, isolated namespace
	// that a driver configured with `partitions` outbox partitions
	// migrated (0: the backend's default), and open, which returns another
	// driver over the same namespace configured with n partitions (0:
	// follow the count stored with the schema). Required.
	NewPartitioned func(t *testing.T, partitions int) (drv ferrydriver.Driver[TTx], open func(n int) ferrydriver.Driver[TTx])
	// ClockGrain is how long after an event retention may keep it for a
	// recovery (MariaDB: a second: it knows when an open transaction
	// started in whole seconds). Default 0.
	ClockGrain time.Duration
}

// Tx is a caller transaction under test.
type Tx[TTx any] struct {
	Tx TTx
	// TakeXID makes the transaction take its transaction id now, before it
	// writes any event (PostgreSQL: a write elsewhere). Optional.
	TakeXID  func() error
	Commit   func() error
	Rollback func() error
	// Exec runs a statement in the transaction (SAVEPOINT s, ROLLBACK TO
	// SAVEPOINT s, RELEASE SAVEPOINT s). Optional: nil for a backend
	// without statements (MongoDB), whose savepoint tests are not run.
	Exec func(stmt string) error
}

// Exercise runs the suite.
func Exercise[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("AppendRoundTrip", func(t *testing.T) { t.Parallel(); testAppendRoundTrip(t, h) })
	t.Run("EdgeCaseEventsArriveExactly", func(t *testing.T) { t.Parallel(); testOutboxEdgeCases(t, h) })
	t.Run("RolledBackDeliversNothing", func(t *testing.T) { t.Parallel(); testRolledBack(t, h) })
	t.Run("SameKeyInOneTxKeepsOrder", func(t *testing.T) { t.Parallel(); testSameKeyOneTx(t, h) })
	t.Run("LateCommitterIsNotSkipped", func(t *testing.T) { t.Parallel(); testLateCommitter(t, h) })
	t.Run("PerKeyCommitOrder", func(t *testing.T) { t.Parallel(); testPerKeyCommitOrder(t, h) })
	t.Run("SameKeyWritersSerialise", func(t *testing.T) { t.Parallel(); testSameKeyWritersSerialise(t, h) })
	t.Run("LongWriterDoesNotStall", func(t *testing.T) { t.Parallel(); testLongWriter(t, h) })
	t.Run("OpenProducerHoldsOnlyItsKeys", func(t *testing.T) { t.Parallel(); testOpenProducer(t, h) })
	t.Run("ConcurrentProducers", func(t *testing.T) { t.Parallel(); testConcurrentProducers(t, h) })
	t.Run("ResumeFromCursor", func(t *testing.T) { t.Parallel(); testResume(t, h) })
	t.Run("SavepointsDeliverWhatCommitted", func(t *testing.T) { t.Parallel(); testSavepoints(t, h) })
	t.Run("WakeUp", func(t *testing.T) { t.Parallel(); testWakeUp(t, h) })
	t.Run("Lease", func(t *testing.T) { t.Parallel(); testLease(t, h) })
	t.Run("CheckpointFencing", func(t *testing.T) { t.Parallel(); testCheckpointFencing(t, h) })
	t.Run("DeadLetters", func(t *testing.T) { t.Parallel(); testDeadLetters(t, h) })
	t.Run("DeadLettersByFeedAndReason", func(t *testing.T) { t.Parallel(); testDeadLettersByFeedAndReason(t, h) })
	t.Run("DeadLetterRetention", func(t *testing.T) { t.Parallel(); testDeadLetterRetention(t, h) })
	t.Run("RedriveDeadLetters", func(t *testing.T) { t.Parallel(); testRedriveDeadLetters(t, h) })
	t.Run("RedriveAndDiscardSelect", func(t *testing.T) { t.Parallel(); testRedriveSelection(t, h) })
	t.Run("Retention", func(t *testing.T) { t.Parallel(); testRetention(t, h) })
	t.Run("RetentionKeepsWhatASlowFeedNeeds", func(t *testing.T) { t.Parallel(); testRetentionSlowestFeed(t, h) })
	t.Run("IdleDeliveredKeysArePruned", func(t *testing.T) { t.Parallel(); testPruneKeys(t, h) })
	t.Run("PruneKeysSweepsInChunks", func(t *testing.T) { t.Parallel(); testPruneKeysSweep(t, h) })
	t.Run("Status", func(t *testing.T) { t.Parallel(); testStatus(t, h) })
	t.Run("EveryFeedIsListed", func(t *testing.T) { t.Parallel(); testListFeeds(t, h) })
	t.Run("Parking", func(t *testing.T) { t.Parallel(); testParking(t, h) })
	t.Run("ParkedAttemptsOutliveTheLeader", func(t *testing.T) { t.Parallel(); testParkedAttempts(t, h) })
	t.Run("ListLeases", func(t *testing.T) { t.Parallel(); testListLeases(t, h) })
	t.Run("LagBeyondTheExactCount", func(t *testing.T) { t.Parallel(); testLagEstimate(t, h) })
	exercisePartitions(t, h)
	if _, ok := h.New(t).(ferrydriver.OutboxReader[TTx]); ok {
		exerciseOutboxReader(t, h)
		exerciseFerrytest(t, h)
	}
}

// Event builds a valid, prepared event.
func Event(topic, key string, payload string) *ferryevent.Event {
	ev := &ferryevent.Event{Topic: topic, Key: key, Type: "Tested", Payload: []byte(payload)}
	if err := ferryevent.Prepare(ev, 0, 0, time.Now()); err != nil {
		panic(err)
	}
	return ev
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func emit[TTx any](ctx context.Context, t *testing.T, h Harness[TTx], drv ferrydriver.Driver[TTx], evs ...*ferryevent.Event) {
	t.Helper()
	tx := h.Begin(ctx, t, drv)
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, &ferrydriver.AppendParams{Events: evs}))
	require.NoError(t, tx.Commit())
}

// Reader drains a feed for tests.
type Reader struct {
	t    *testing.T
	Feed ferrydriver.Feed
	Last []byte
}

// OpenReader opens partition 0 of a store from cursor.
func OpenReader(ctx context.Context, t *testing.T, s ferrydriver.Store, cursor []byte) *Reader {
	t.Helper()
	f, err := s.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "test/0", Cursor: cursor})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return &Reader{t: t, Feed: f, Last: cursor}
}

// ReadN reads until n events arrived or ctx ends.
func (r *Reader) ReadN(ctx context.Context, n int) []*ferryevent.Event {
	r.t.Helper()
	var out []*ferryevent.Event
	for len(out) < n {
		b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 100, Wait: 50 * time.Millisecond})
		require.NoError(r.t, err, "read feed after %d of %d events", len(out), n)
		out = append(out, b.Events...)
		r.Last = b.Cursor
	}
	return out
}

// ReadQuiet reads until a read returns nothing, and returns what it read.
func (r *Reader) ReadQuiet(ctx context.Context) []*ferryevent.Event {
	r.t.Helper()
	var out []*ferryevent.Event
	empty := 0
	for empty < 2 {
		b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 100, Wait: 20 * time.Millisecond})
		require.NoError(r.t, err)
		r.Last = b.Cursor
		if len(b.Events) == 0 {
			empty++
			continue
		}
		empty = 0
		out = append(out, b.Events...)
	}
	return out
}

func ids(evs []*ferryevent.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID.String()
	}
	return out
}

func testAppendRoundTrip[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	ev := Event("orders", "order-1", "")
	ev.Source = "shop"
	ev.ContentType = "application/octet-stream"
	ev.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x": "y"}
	ev.Payload = []byte{0, 1, 2, 0xff, 'a'}
	ev.CreatedAt = time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	empty := Event("orders", "order-2", "")
	empty.Payload = nil
	emit(ctx, t, h, drv, ev, empty)
	require.NoError(t, drv.Append(ctx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{Event("orders", "order-1", "own-tx")}}))

	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 3)
	require.Len(t, got, 3)
	g := got[0]
	require.Equal(t, ev.ID, g.ID)
	require.Equal(t, "orders", g.Topic)
	require.Equal(t, "order-1", g.Key)
	require.Equal(t, "Tested", g.Type)
	require.Equal(t, "shop", g.Source)
	require.Equal(t, "application/octet-stream", g.ContentType)
	require.Equal(t, ev.Headers, g.Headers)
	require.Equal(t, ev.Payload, g.Payload)
	require.True(t, ev.CreatedAt.Equal(g.CreatedAt), "created_at %v, want %v", g.CreatedAt, ev.CreatedAt)
	require.EqualValues(t, 1, g.Seq)
	require.Empty(t, got[1].Payload)
	require.EqualValues(t, 1, got[1].Seq)
	require.Equal(t, "own-tx", string(got[2].Payload))
	require.EqualValues(t, 2, got[2].Seq, "the second event of order-1 has Seq 2")
}

// testOutboxEdgeCases: every edge-case event Emit accepts is stored and
// read back by the feed exactly (ferryeventtest).
func testOutboxEdgeCases[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	drv := h.New(t)
	accepted := ferryeventtest.Prepare(t, ferryeventtest.Cases(0), 0)
	emit(ctx, t, h, drv, accepted...)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, len(accepted))
	require.Len(t, got, len(accepted))
	byID := make(map[uuid.UUID]*ferryevent.Event, len(got))
	for _, ev := range got {
		byID[ev.ID] = ev
	}
	for _, want := range accepted {
		ferryeventtest.RequireSame(t, want, byID[want.ID])
	}
}

func testRolledBack[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	tx := h.Begin(ctx, t, drv)
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{Event("t", "k", "rolled back")}}))
	require.NoError(t, tx.Rollback())
	after := Event("t", "k", "committed")
	emit(ctx, t, h, drv, after)
	got := OpenReader(ctx, t, drv, nil).ReadQuiet(ctx)
	require.Equal(t, []string{after.ID.String()}, ids(got))
	require.EqualValues(t, 1, got[0].Seq, "a rolled-back event must not use up a key sequence number")
}

func testSameKeyOneTx[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	var evs []*ferryevent.Event
	for i := range 200 {
		evs = append(evs, Event("t", "k"+strconv.Itoa(i%3), strconv.Itoa(i)))
	}
	emit(ctx, t, h, drv, evs...)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 200)
	seqs := map[string]int64{}
	perKey := map[string][]string{}
	for _, e := range got {
		seqs[e.Key]++
		require.Equal(t, seqs[e.Key], e.Seq, "key %s", e.Key)
		perKey[e.Key] = append(perKey[e.Key], string(e.Payload))
	}
	for k, payloads := range perKey {
		var want []string
		for i := range 200 {
			if "k"+strconv.Itoa(i%3) == k {
				want = append(want, strconv.Itoa(i))
			}
		}
		require.Equal(t, want, payloads, "key %s must be delivered in emit order", k)
	}
}

func requireConcurrent[TTx any](t *testing.T, h Harness[TTx], drv ferrydriver.Store) bool {
	if !drv.Capabilities().ConcurrentWriters {
		t.Logf("%s has a single writer: concurrent-transaction orderings cannot occur; checked by the sequential tests", drv.Name())
		return false
	}
	return true
}

// A transaction that takes its id first and commits last must be delivered.
func testLateCommitter[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	r := OpenReader(ctx, t, drv, nil)
	late := h.Begin(ctx, t, drv)
	require.NotNil(t, late.TakeXID, "harness must provide TakeXID for a concurrent-writer backend")
	require.NoError(t, late.TakeXID())
	lateEv := Event("t", "late", "late")
	require.NoError(t, drv.AppendTx(ctx, late.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{lateEv}}))
	var early []*ferryevent.Event
	for i := range 20 {
		ev := Event("t", "early-"+strconv.Itoa(i), "early")
		early = append(early, ev)
		emit(ctx, t, h, drv, ev)
	}
	got := r.ReadN(ctx, 20)
	require.ElementsMatch(t, ids(early), ids(got))
	require.NoError(t, late.Commit())
	got = r.ReadN(ctx, 1)
	require.Equal(t, []string{lateEv.ID.String()}, ids(got), "the late committer's event must be delivered, not skipped")
	require.Empty(t, r.ReadQuiet(ctx))
}

// T2 takes its transaction id before T1; T1 emits for K and commits first;
// then T2 emits for K and commits. Delivery: T1's event, then T2's.
func testPerKeyCommitOrder[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	t2 := h.Begin(ctx, t, drv)
	require.NoError(t, t2.TakeXID())
	t1 := h.Begin(ctx, t, drv)
	require.NoError(t, t1.TakeXID())
	e1 := Event("t", "K", "from T1")
	require.NoError(t, drv.AppendTx(ctx, t1.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{e1}}))
	require.NoError(t, t1.Commit())
	e2 := Event("t", "K", "from T2")
	err := drv.AppendTx(ctx, t2.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{e2}})
	if err == nil {
		err = t2.Commit()
	}
	if err != nil && h.Retryable != nil && h.Retryable(err) {
		// T2's snapshot predates T1's write of K: it aborts, and its rerun
		// comes after T1.
		t.Logf("T2 aborted on the conflict with T1 (%v) and runs again", err)
		_ = t2.Rollback()
		emit(ctx, t, h, drv, e2)
		err = nil
	}
	require.NoError(t, err)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 2)
	require.Equal(t, ids([]*ferryevent.Event{e1, e2}), ids(got))
	require.EqualValues(t, []int64{1, 2}, []int64{got[0].Seq, got[1].Seq})
}

// T2 emits for K first; T1's emit for K must wait for T2 to end, so the
// commit order is T2, T1 and delivery follows it. Other keys do not wait.
func testSameKeyWritersSerialise[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	t2 := h.Begin(ctx, t, drv)
	e2 := Event("t", "K", "from T2")
	require.NoError(t, drv.AppendTx(ctx, t2.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{e2}}))

	other := Event("t", "other", "x")
	emit(ctx, t, h, drv, other) // another key does not wait for T2

	e1 := Event("t", "K", "from T1")
	if h.Retryable != nil {
		// Writers of one key abort instead of waiting: T1 fails while T2
		// holds K, and its rerun after T2's commit lands after T2.
		t1 := h.Begin(ctx, t, drv)
		err := drv.AppendTx(ctx, t1.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{e1}})
		if err == nil {
			err = t1.Commit()
		}
		require.Error(t, err, "T1 wrote K while T2 held it")
		require.True(t, h.Retryable(err), "T1's conflict must be retryable: %v", err)
		_ = t1.Rollback()
		require.NoError(t, t2.Commit())
		emit(ctx, t, h, drv, e1)
		got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 3)
		var k []string
		for _, e := range got {
			if e.Key == "K" {
				k = append(k, e.ID.String())
			}
		}
		require.Equal(t, ids([]*ferryevent.Event{e2, e1}), k)
		return
	}
	done := make(chan error, 1)
	go func() {
		t1 := h.Begin(ctx, t, drv)
		err := drv.AppendTx(ctx, t1.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{e1}})
		if err == nil {
			err = t1.Commit()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("T1's append for K finished (%v) while T2 still held K", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, t2.Commit())
	require.NoError(t, <-done)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 3)
	var k []string
	for _, e := range got {
		if e.Key == "K" {
			k = append(k, e.ID.String())
		}
	}
	require.Equal(t, ids([]*ferryevent.Event{e2, e1}), k)
}

// A write transaction held open elsewhere must not delay delivery.
func testLongWriter[TTx any](t *testing.T, h Harness[TTx]) {
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	hold := h.LongWriterHold
	if hold == 0 {
		hold = 10 * time.Second
	}
	const poll = 500 * time.Millisecond
	ctx := ctxT(t, hold+60*time.Second)
	end := h.HoldWriter(ctx, t)
	heldUntil := time.Now().Add(hold)
	defer end()

	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "test/0"})
	require.NoError(t, err)
	defer f.Close()
	const n = 1000
	emitted := make(chan time.Time, 1)
	go func() {
		for i := 0; i < n; i += 50 {
			var evs []*ferryevent.Event
			for j := range 50 {
				evs = append(evs, Event("t", "k"+strconv.Itoa((i+j)%37), "x"))
			}
			if err := drv.Append(ctx, &ferrydriver.AppendParams{Events: evs}); err != nil {
				t.Error(err)
			}
		}
		emitted <- time.Now()
	}()
	got := 0
	var lastEmit time.Time
	for got < n {
		b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 500, Wait: poll})
		require.NoError(t, err)
		got += len(b.Events)
		select {
		case lastEmit = <-emitted:
		default:
		}
	}
	if lastEmit.IsZero() {
		lastEmit = <-emitted
	}
	deliveredAt := time.Now()
	require.True(t, deliveredAt.Before(heldUntil), "all %d events must be delivered while the long writer is still open (it ends at %v, delivery finished at %v)", n, heldUntil, deliveredAt)
	lag := deliveredAt.Sub(lastEmit)
	require.LessOrEqual(t, lag, 2*poll, "the last events arrived %v after their commit; the limit is 2 x the poll interval", lag)
	// Keep the writer open for the whole hold, as the scenario says.
	time.Sleep(time.Until(heldUntil))
}

// testOpenProducer: a producer transaction that appended to a key and
// stays open holds that key's writers, and no other's: an append of many
// other keys, around it in key order too, goes through while it is open.
func testOpenProducer[TTx any](t *testing.T, h Harness[TTx]) {
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	ctx := ctxT(t, 2*time.Minute)
	// Other keys exist already, so that the append below updates them.
	var keys []string
	for _, k := range []string{"a", "l", "m-a", "m-z", "n", "z"} {
		for i := range 4 {
			keys = append(keys, k+strconv.Itoa(i))
		}
	}
	var first []*ferryevent.Event
	for _, k := range append(keys, "m-held") {
		first = append(first, Event("t", k, "first"))
	}
	emit(ctx, t, h, drv, first...)
	open := h.Begin(ctx, t, drv)
	held := Event("t", "m-held", "held")
	require.NoError(t, drv.AppendTx(ctx, open.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{held}}))

	var others []*ferryevent.Event
	for _, k := range keys {
		others = append(others, Event("t", k, "second"))
	}
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, drv.Append(actx, &ferrydriver.AppendParams{Events: others}), "an append of other keys waits for an open producer of key m-held")
	require.NoError(t, open.Commit())
	want := append(append(first, others...), held)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, len(want))
	require.Equal(t, ids(want), ids(sortByKeyOrder(want, got)))
}

func testConcurrentProducers[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	drv := h.New(t)
	const writers, perWriter, keys = 8, 60, 11
	r := OpenReader(ctx, t, drv, nil)
	var mu sync.Mutex
	committed := map[string]bool{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range perWriter {
				var evs []*ferryevent.Event
				for j := range 1 + rng.IntN(3) {
					evs = append(evs, Event("t", "k"+strconv.Itoa(rng.IntN(keys)), fmt.Sprintf("%d-%d-%d", w, i, j)))
				}
				rollback := rng.IntN(5) == 0
				takeXID := rng.IntN(3) == 0
				var err error
				for attempt := 0; attempt < 100; attempt++ {
					tx := h.Begin(ctx, t, drv)
					if tx.TakeXID != nil && takeXID {
						if err = tx.TakeXID(); err != nil {
							_ = tx.Rollback()
							break
						}
					}
					if err = drv.AppendTx(ctx, tx.Tx, &ferrydriver.AppendParams{Events: evs}); err == nil {
						if rollback {
							err = tx.Rollback()
							break
						}
						err = tx.Commit()
					} else {
						_ = tx.Rollback()
					}
					if err == nil || h.Retryable == nil || !h.Retryable(err) {
						break
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				if rollback {
					continue
				}
				mu.Lock()
				for _, e := range evs {
					committed[e.ID.String()] = true
				}
				mu.Unlock()
			}
		}()
	}
	var got []*ferryevent.Event
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 37, Wait: 10 * time.Millisecond})
		require.NoError(t, err)
		got = append(got, b.Events...)
		select {
		case <-done:
			got = append(got, r.ReadQuiet(ctx)...)
			goto check
		default:
		}
	}
check:
	seen := map[string]bool{}
	lastSeq := map[string]int64{}
	for _, e := range got {
		require.False(t, seen[e.ID.String()], "event %s delivered twice", e.ID)
		seen[e.ID.String()] = true
		require.True(t, committed[e.ID.String()], "event %s was not committed", e.ID)
		if lastSeq[e.Key]+1 != e.Seq {
			for _, x := range got {
				if x.Key == e.Key {
					t.Logf("%s seq=%d id=%s payload=%s", x.Key, x.Seq, x.ID, x.Payload)
				}
			}
		}
		require.Equal(t, lastSeq[e.Key]+1, e.Seq, "key %s: seq must increase by one", e.Key)
		lastSeq[e.Key] = e.Seq
	}
	require.Len(t, seen, len(committed), "every committed event delivered")
}

func testResume[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	var all []*ferryevent.Event
	for i := range 30 {
		all = append(all, Event("t", "k"+strconv.Itoa(i%4), strconv.Itoa(i)))
	}
	emit(ctx, t, h, drv, all[:10]...)
	r := OpenReader(ctx, t, drv, nil)
	b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 4, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Events, 4)
	cursor := b.Cursor
	// Events read after the saved cursor are "in flight" and get re-read.
	_, err = r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 3, Wait: time.Second})
	require.NoError(t, err)
	emit(ctx, t, h, drv, all[10:]...)

	r2 := OpenReader(ctx, t, drv, cursor)
	rest := r2.ReadQuiet(ctx)
	require.Equal(t, ids(all[4:]), ids(sortByKeyOrder(all[4:], rest)))
	// and a third reader from the end gets nothing
	require.Empty(t, OpenReader(ctx, t, drv, r2.Last).ReadQuiet(ctx))
}

// sortByKeyOrder checks rest holds exactly want's events with each key's
// order kept, and returns them in want's order.
func sortByKeyOrder(want, rest []*ferryevent.Event) []*ferryevent.Event {
	pos := map[string]int{}
	for i, e := range rest {
		pos[e.ID.String()] = i
	}
	out := make([]*ferryevent.Event, 0, len(rest))
	lastPos := map[string]int{}
	for _, e := range want {
		p, ok := pos[e.ID.String()]
		if !ok {
			return rest
		}
		if lp, ok := lastPos[e.Key]; ok && p < lp {
			return rest
		}
		lastPos[e.Key] = p
		out = append(out, rest[p])
	}
	if len(out) != len(rest) {
		return rest
	}
	return out
}

func testWakeUp[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	drv := h.New(t)
	if !drv.Capabilities().NotifyWakeups {
		t.Logf("%s has no wake-ups: the feed polls; checked by the other tests", drv.Name())
		return
	}
	r := OpenReader(ctx, t, drv, nil)
	require.Empty(t, r.ReadQuiet(ctx))
	got := make(chan *ferrydriver.Batch, 1)
	go func() {
		b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 30 * time.Second})
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	time.Sleep(100 * time.Millisecond)
	ev := Event("t", "k", "wake")
	start := time.Now()
	emit(ctx, t, h, drv, ev)
	select {
	case b := <-got:
		require.Equal(t, []string{ev.ID.String()}, ids(b.Events))
	case <-time.After(10 * time.Second):
		t.Fatal("a commit did not wake a feed waiting for 30 s")
	}
	t.Logf("woken %v after the commit started", time.Since(start))
}

func testLease[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	const name = "lease/0"
	a, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: name, Holder: "a", TTL: time.Second})
	require.NoError(t, err)
	require.True(t, a.Held("a"))
	require.EqualValues(t, 1, a.Term)

	b, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: name, Holder: "b", TTL: time.Second})
	require.NoError(t, err)
	require.Equal(t, "a", b.Holder, "b must be denied while a holds the lease")
	require.False(t, b.Held("b"))

	again, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: name, Holder: "a", TTL: time.Second})
	require.NoError(t, err)
	require.EqualValues(t, 1, again.Term, "re-acquiring a held lease keeps the term")

	_, err = drv.RenewLease(ctx, &ferrydriver.RenewLeaseParams{Name: name, Holder: "a", Term: 1, TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: name, Holder: "b", TTL: time.Minute})
		return err == nil && l.Held("b")
	}, 5*time.Second, 50*time.Millisecond, "b takes over once a's lease expires")
	lb, err := drv.GetLease(ctx, name)
	require.NoError(t, err)
	require.EqualValues(t, 2, lb.Term, "a change of holder increments the term")

	_, err = drv.RenewLease(ctx, &ferrydriver.RenewLeaseParams{Name: name, Holder: "a", Term: 1, TTL: time.Second})
	require.ErrorIs(t, err, ferrydriver.ErrLeaseLost)

	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.ReleaseLeaseParams{Name: name, Holder: "b", Term: 2}))
	c, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: name, Holder: "c", TTL: time.Second})
	require.NoError(t, err)
	require.True(t, c.Held("c"), "a released lease is free at once")
	require.EqualValues(t, 3, c.Term)

	_, err = drv.GetLease(ctx, "no-such-lease")
	require.ErrorIs(t, err, ferrydriver.ErrNotFound)
}

func testCheckpointFencing[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	const feed = "cp/0"
	cp, err := drv.LoadCheckpoint(ctx, &ferrydriver.LoadCheckpointParams{Feed: feed})
	require.NoError(t, err)
	require.Nil(t, cp.Cursor, "a feed never saved has no cursor")

	err = drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: []byte("x"), Holder: "a", Term: 1})
	require.ErrorIs(t, err, ferrydriver.ErrLeaseLost, "saving without holding the lease is rejected")

	a, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: feed, Holder: "a", TTL: 400 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: []byte("c1"), Holder: "a", Term: a.Term}))
	cp, err = drv.LoadCheckpoint(ctx, &ferrydriver.LoadCheckpointParams{Feed: feed})
	require.NoError(t, err)
	require.Equal(t, "c1", string(cp.Cursor))
	require.Equal(t, a.Term, cp.Term)

	// a pauses past its TTL; b takes over; a's late write is rejected.
	require.Eventually(t, func() bool {
		l, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: feed, Holder: "b", TTL: time.Minute})
		return err == nil && l.Held("b")
	}, 5*time.Second, 50*time.Millisecond)
	err = drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: []byte("zombie"), Holder: "a", Term: a.Term})
	require.ErrorIs(t, err, ferrydriver.ErrLeaseLost)
	err = drv.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: feed, Holder: "a", Term: a.Term,
		DeadLetters: []*ferrydriver.DeadLetter{{Event: *Event("t", "k", "x"), Reason: "zombie"}}})
	require.ErrorIs(t, err, ferrydriver.ErrLeaseLost)
	cp, err = drv.LoadCheckpoint(ctx, &ferrydriver.LoadCheckpointParams{Feed: feed})
	require.NoError(t, err)
	require.Equal(t, "c1", string(cp.Cursor), "the zombie's checkpoint must not land")
}

func testDeadLetters[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	const feed = "dl/0"
	l, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: feed, Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	e1, e2 := Event("orders", "k1", "one"), Event("payments", "k2", "two")
	e1.Headers = map[string]string{"h": "v"}
	dls := []*ferrydriver.DeadLetter{{Event: *e1, Reason: "too large"}, {Event: *e2, Reason: "unroutable"}}
	p := &ferrydriver.InsertDeadLettersParams{Feed: feed, Holder: "a", Term: l.Term, DeadLetters: dls}
	require.NoError(t, drv.InsertDeadLetters(ctx, p))
	require.NoError(t, drv.InsertDeadLetters(ctx, p), "inserting again is harmless")

	all, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: feed})
	require.NoError(t, err)
	require.Len(t, all, 2)
	byKey, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Key: "k2"})
	require.NoError(t, err)
	require.Len(t, byKey, 1)
	require.Equal(t, "unroutable", byKey[0].Reason)
	byTopic, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Topic: "orders", Since: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Len(t, byTopic, 1)
	none, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Until: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Empty(t, none)

	got, err := drv.GetDeadLetter(ctx, &ferrydriver.GetDeadLetterParams{Feed: feed, EventID: e1.ID})
	require.NoError(t, err)
	require.Equal(t, "too large", got.Reason)
	require.Equal(t, e1.Payload, got.Event.Payload)
	require.Equal(t, e1.Headers, got.Event.Headers)
	_, err = drv.GetDeadLetter(ctx, &ferrydriver.GetDeadLetterParams{Feed: feed, EventID: ferryevent.NewID()})
	require.ErrorIs(t, err, ferrydriver.ErrNotFound)
}

// testDeadLettersByFeedAndReason: a feed's name selects every partition
// of it and no other feed's, a partition's name that partition; a reason
// selects the dead letters whose reason contains it; the count is of
// every match.
func testDeadLettersByFeedAndReason[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	h0, h1, other, nested := Event("t", "k", "h0"), Event("t", "k", "h1"), Event("t", "k", "hooksx"), Event("t", "k", "nested")
	insertDeadLettersWhy(ctx, t, drv, "hooks/0", "410 Gone", h0)
	insertDeadLettersWhy(ctx, t, drv, "hooks/1", "timeout after 3s", h1)
	insertDeadLettersWhy(ctx, t, drv, "hooksx/0", "410 Gone", other)
	insertDeadLettersWhy(ctx, t, drv, "hooks/x/0", "410 Gone", nested)
	list := func(p *ferrydriver.ListDeadLettersParams) []string {
		t.Helper()
		dls, err := drv.ListDeadLetters(ctx, p)
		require.NoError(t, err)
		var out []string
		for _, dl := range dls {
			out = append(out, string(dl.Event.Payload))
		}
		n, err := drv.CountDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: p.Feed, Reason: p.Reason, Limit: 1})
		require.NoError(t, err)
		require.EqualValues(t, len(out), n, "the count is of every match, whatever the limit")
		return out
	}
	require.ElementsMatch(t, []string{"h0", "h1"}, list(&ferrydriver.ListDeadLettersParams{Feed: "hooks"}), "a feed's name: every partition of it")
	require.Equal(t, []string{"h1"}, list(&ferrydriver.ListDeadLettersParams{Feed: "hooks/1"}), "a partition's name: that partition")
	require.Equal(t, []string{"nested"}, list(&ferrydriver.ListDeadLettersParams{Feed: "hooks/x"}))
	require.Empty(t, list(&ferrydriver.ListDeadLettersParams{Feed: "hook"}))
	require.ElementsMatch(t, []string{"h0", "hooksx", "nested"}, list(&ferrydriver.ListDeadLettersParams{Reason: "410"}), "a reason: those containing it")
	require.Equal(t, []string{"h0"}, list(&ferrydriver.ListDeadLettersParams{Feed: "hooks", Reason: "Gone"}))
	require.Len(t, list(&ferrydriver.ListDeadLettersParams{}), 4)
	got, err := drv.GetDeadLetter(ctx, &ferrydriver.GetDeadLetterParams{Feed: "hooks", EventID: h1.ID})
	require.NoError(t, err)
	require.Equal(t, "hooks/1", got.Feed)
	_, err = drv.GetDeadLetter(ctx, &ferrydriver.GetDeadLetterParams{Feed: "hooksx", EventID: h1.ID})
	require.ErrorIs(t, err, ferrydriver.ErrNotFound)
	for _, f := range []string{"", "hooks", "hooks/0", "hooks/1", "hooksx", "hooks/x", "hook"} {
		for _, dl := range []string{"hooks/0", "hooks/1", "hooksx/0", "hooks/x/0"} {
			dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: f})
			require.NoError(t, err)
			listed := false
			for _, d := range dls {
				listed = listed || d.Feed == dl
			}
			require.Equal(t, driverkit.InFeed(f, dl), listed, "filter %q, dead letter of %s: the store and InFeed agree", f, dl)
		}
	}
}

// insertDeadLettersWhy stores events as feed's dead letters with a reason.
func insertDeadLettersWhy(ctx context.Context, t *testing.T, drv ferrydriver.Store, feed, reason string, evs ...*ferryevent.Event) {
	t.Helper()
	l, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: feed, Holder: "dl", TTL: time.Minute})
	require.NoError(t, err)
	var dls []*ferrydriver.DeadLetter
	for _, ev := range evs {
		dls = append(dls, &ferrydriver.DeadLetter{Event: *ev, Reason: reason})
	}
	require.NoError(t, drv.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: feed, Holder: "dl", Term: l.Term, DeadLetters: dls}))
}

// insertDeadLetters stores events as feed's dead letters under a lease.
func insertDeadLetters(ctx context.Context, t *testing.T, drv ferrydriver.Store, feed string, evs ...*ferryevent.Event) {
	t.Helper()
	insertDeadLettersWhy(ctx, t, drv, feed, "rejected", evs...)
}

// testDeadLetterRetention: a feed's dead letters go once older than the
// retention, oldest first, a limited number per call; other feeds' stay.
func testDeadLetterRetention[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	a1, a2, a3, b1 := Event("t", "k", "a1"), Event("t", "k", "a2"), Event("t", "k", "a3"), Event("t", "k", "b1")
	insertDeadLetters(ctx, t, drv, "a/0", a1)
	time.Sleep(5 * time.Millisecond) // failure times (milliseconds on MongoDB) must differ
	insertDeadLetters(ctx, t, drv, "a/0", a2, a3)
	insertDeadLetters(ctx, t, drv, "b/0", b1)
	time.Sleep(5 * time.Millisecond)

	n, err := drv.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: "a/0", OlderThan: time.Hour, Limit: 10})
	require.NoError(t, err)
	require.Zero(t, n, "nothing is an hour old")
	n, err = drv.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: "a/0", Limit: 1})
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "at most Limit")
	left, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: "a/0"})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{a2.ID.String(), a3.ID.String()}, []string{left[0].Event.ID.String(), left[1].Event.ID.String()}, "the oldest went first")
	n, err = drv.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: "a/0", Limit: 10})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	left, err = drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, b1.ID, left[0].Event.ID, "another feed's dead letters stay")
}

// redrivenHeads returns the payloads of the heads of feed's keys with
// redriven events.
func redrivenHeads(ctx context.Context, t *testing.T, drv ferrydriver.Store, feed string) []string {
	t.Helper()
	heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed, Redriven: true})
	require.NoError(t, err)
	var out []string
	for _, h := range heads {
		out = append(out, string(h.Event.Payload))
	}
	return out
}

// testRedriveDeadLetters: a redriven dead letter goes back to the feed
// that dead-lettered it and to no other: it joins its key's parked queue
// in that feed, behind what the key has parked there, marked redriven,
// whole (ID, Seq, headers, time), and nothing is appended to the outbox,
// which every feed reads. The dead letter is gone, so a second redrive
// finds nothing; once the relay published it (UnparkEvent), the feed has
// no redriven key left.
func testRedriveDeadLetters[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	pk := drv
	emit(ctx, t, h, drv, Event("t", "K", "first"))
	r := OpenReader(ctx, t, drv, nil)
	read := r.ReadQuiet(ctx)
	require.Len(t, read, 1)
	first := read[0]
	first.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	insertDeadLetters(ctx, t, drv, "dl/0", first) // as the relay does, with the event as read
	emit(ctx, t, h, drv, Event("t", "K", "second"))
	require.Len(t, r.ReadQuiet(ctx), 1)
	// Key J has an event parked in dl/0 already: a redriven one goes behind.
	l, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: "dl/0", Holder: "dl", TTL: time.Minute})
	require.NoError(t, err)
	stuck, old := Event("t", "J", "stuck"), Event("t", "J", "old")
	require.NoError(t, pk.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: "dl/0", Holder: "dl", Term: l.Term, Events: []*ferryevent.Event{stuck}, Reason: "503"}))
	insertDeadLetters(ctx, t, drv, "dl/0", old)
	require.Empty(t, redrivenHeads(ctx, t, drv, "dl/0"), "no key has a redriven event yet")

	n, err := drv.RedriveDeadLetters(ctx, &ferrydriver.DeadLetterSelection{Letters: []ferrydriver.DeadLetterRef{{Feed: "dl/0", EventID: first.ID}, {Feed: "dl/0", EventID: old.ID}}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Empty(t, r.ReadQuiet(ctx), "nothing is appended to the outbox: no other feed sees it")
	require.ElementsMatch(t, []string{"first", "stuck"}, redrivenHeads(ctx, t, drv, "dl/0"), "the keys with redriven events, by their heads")
	require.Empty(t, redrivenHeads(ctx, t, drv, "other/0"), "another feed has none")

	heads, err := pk.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "dl/0", Keys: []string{"K", "J"}})
	require.NoError(t, err)
	byKey := map[string]*ferrydriver.ParkedEvent{}
	for _, h := range heads {
		byKey[h.Event.Key] = h
	}
	got := byKey["K"].Event
	require.Equal(t, first.ID, got.ID, "the same event ID: consumers deduplicate")
	require.Equal(t, first.Seq, got.Seq, "its Seq")
	require.Equal(t, first.Headers, got.Headers)
	require.Equal(t, first.Payload, got.Payload)
	require.True(t, first.CreatedAt.Equal(got.CreatedAt))
	require.True(t, byKey["K"].Redriven)
	require.Contains(t, byKey["K"].Reason, "rejected", "the reason it was dead-lettered")
	require.Equal(t, stuck.ID, byKey["J"].Event.ID, "J's parked event first")
	require.False(t, byKey["J"].Redriven)
	unpark := func(ev *ferryevent.Event) {
		t.Helper()
		require.NoError(t, pk.UnparkEvent(ctx, &ferrydriver.UnparkEventParams{Feed: "dl/0", Holder: "dl", Term: l.Term, Key: ev.Key, EventID: ev.ID}))
	}
	unpark(stuck)
	heads, err = pk.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "dl/0", Keys: []string{"J"}})
	require.NoError(t, err)
	require.Equal(t, old.ID, heads[0].Event.ID, "then the redriven one")

	left, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Empty(t, left)
	n, err = drv.RedriveDeadLetters(ctx, &ferrydriver.DeadLetterSelection{Letters: []ferrydriver.DeadLetterRef{{Feed: "dl/0", EventID: first.ID}}})
	require.NoError(t, err)
	require.Zero(t, n, "gone: nothing to redrive")
	unpark(&got)
	unpark(old)
	require.Empty(t, redrivenHeads(ctx, t, drv, "dl/0"), "published: no redriven key left")
	require.Empty(t, r.ReadQuiet(ctx))
}

// testListFeeds: the store names every feed with a checkpoint, a lease,
// dead letters or parked events, once each, in order; RelayFeeds shows
// every partition of the relay feeds among them (and only relay feeds), a
// feed's or a partition's when asked, and "default"'s on an empty store.
func testListFeeds[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	feeds := func(filter string) []string {
		t.Helper()
		got, err := driverkit.RelayFeeds(ctx, drv, filter)
		require.NoError(t, err)
		return got
	}
	require.Equal(t, []string{"default/0"}, feeds(""), "an empty store: the default feed's")
	require.Equal(t, []string{"shop/0"}, feeds("shop"), "a feed asked for, though nothing is known of it")

	l, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: "a/0", Holder: "r", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: "a/0", Cursor: []byte("c"), Holder: "r", Term: l.Term}))
	for _, name := range []string{"b/1", "members/a/r#1", "chain/eth", "consumer-gauges/7"} {
		_, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: name, Holder: "r", TTL: time.Minute})
		require.NoError(t, err)
	}
	insertDeadLetters(ctx, t, drv, "c/0", Event("t", "k", "x"), Event("t", "k2", "y"))
	insertDeadLetters(ctx, t, drv, "c/0", Event("t", "k3", "z"))
	l, err = drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: "d/2", Holder: "r", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: "d/2", Holder: "r", Term: l.Term, Events: []*ferryevent.Event{Event("t", "k", "p")}}))
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.ReleaseLeaseParams{Name: "d/2", Holder: "r", Term: l.Term}))
	names, err := drv.ListFeeds(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"a/0", "b/1", "c/0", "chain/eth", "consumer-gauges/7", "d/2", "members/a/r#1"}, names,
		"each name once, in order: checkpoints, leases, dead letters, parked events")
	require.Equal(t, []string{"a/0", "b/0", "b/1", "c/0", "d/0", "d/2"}, feeds(""), "every partition of each relay feed, and only relay feeds")
	require.Equal(t, []string{"b/0", "b/1"}, feeds("b"))
	require.Equal(t, []string{"b/1"}, feeds("b/1"))
	require.Equal(t, []string{"d/2"}, feeds("d/2"))
}

// testRedriveSelection: redrive and discard act on the dead letters
// named, each by feed and event, and on no other: an event dead-lettered
// by two feeds keeps the other feed's dead letter, and a redrive goes to
// the feed named only; an empty selection is nothing, never every feed; a
// named dead letter already gone is not counted; a dead letter that is not
// a valid event stops the redrive, changing nothing, and can be discarded.
func testRedriveSelection[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	r := OpenReader(ctx, t, drv, nil)
	a, b, c := Event("orders", "ka", "a"), Event("payments", "kb", "b"), Event("orders", "kc", "c")
	insertDeadLetters(ctx, t, drv, "f/0", a, b, c)
	insertDeadLetters(ctx, t, drv, "g/0", c)
	refs := func(pairs ...any) *ferrydriver.DeadLetterSelection {
		sel := &ferrydriver.DeadLetterSelection{}
		for i := 0; i < len(pairs); i += 2 {
			sel.Letters = append(sel.Letters, ferrydriver.DeadLetterRef{Feed: pairs[i].(string), EventID: pairs[i+1].(*ferryevent.Event).ID})
		}
		return sel
	}
	left := func() []string {
		t.Helper()
		dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
		require.NoError(t, err)
		var out []string
		for _, dl := range dls {
			out = append(out, dl.Feed+" "+string(dl.Event.Payload))
		}
		return out
	}

	n, err := drv.RedriveDeadLetters(ctx, refs())
	require.NoError(t, err)
	require.Zero(t, n, "no dead letter named: none, never every feed's")
	n, err = drv.DiscardDeadLetters(ctx, refs())
	require.NoError(t, err)
	require.Zero(t, n)
	require.Len(t, left(), 4)

	n, err = drv.RedriveDeadLetters(ctx, refs("f/0", c, "f/0", b))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.ElementsMatch(t, []string{"b", "c"}, redrivenHeads(ctx, t, drv, "f/0"), "back to f/0")
	require.Empty(t, redrivenHeads(ctx, t, drv, "g/0"), "and not to g/0")
	require.Empty(t, r.ReadQuiet(ctx), "nor to the outbox")
	require.ElementsMatch(t, []string{"f/0 a", "g/0 c"}, left(), "g/0's dead letter of c stays")

	n, err = drv.DiscardDeadLetters(ctx, refs("f/0", c, "g/0", a))
	require.NoError(t, err)
	require.Zero(t, n, "f/0's c is gone and g/0 has no a: nothing")
	n, err = drv.DiscardDeadLetters(ctx, refs("g/0", c))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"f/0 a"}, left(), "f/0's dead letter of a stays")

	bad := Event("orders", "kx", "undecodable")
	bad.Topic = "" // as a record the feed could not decode is dead-lettered
	insertDeadLetters(ctx, t, drv, "f/0", bad)
	_, err = drv.RedriveDeadLetters(ctx, refs("f/0", a, "f/0", bad))
	require.Error(t, err)
	require.Contains(t, err.Error(), bad.ID.String())
	require.Contains(t, err.Error(), "discard")
	require.Len(t, left(), 2, "nothing changed: a and bad are still there")
	require.ElementsMatch(t, []string{"b", "c"}, redrivenHeads(ctx, t, drv, "f/0"), "and nothing was parked")

	n, err = drv.DiscardDeadLetters(ctx, refs("f/0", bad))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{EventIDs: []uuid.UUID{a.ID, bad.ID}})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, a.ID, got[0].Event.ID, "the list selects by event ID too")
	require.Empty(t, r.ReadQuiet(ctx), "a discarded dead letter is not published")
}

func testRetention[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	var first []*ferryevent.Event
	for i := range 10 {
		first = append(first, Event("t", "k", strconv.Itoa(i)))
	}
	emit(ctx, t, h, drv, first...)
	r := OpenReader(ctx, t, drv, nil)
	require.Len(t, r.ReadQuiet(ctx), 10)
	time.Sleep(h.ClockGrain)
	var straggler Tx[TTx]
	var lateEv *ferryevent.Event
	if drv.Capabilities().ConcurrentWriters {
		straggler = h.Begin(ctx, t, drv)
		require.NoError(t, straggler.TakeXID())
		lateEv = Event("t", "late", "late")
		require.NoError(t, drv.AppendTx(ctx, straggler.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{lateEv}}))
	}
	emit(ctx, t, h, drv, Event("t", "k", "after"))
	require.Len(t, r.ReadQuiet(ctx), 1)
	if lateEv != nil {
		require.NoError(t, straggler.Commit())
	}
	// The checkpoint is the position before the straggler was read.
	n, err := drv.DeleteDelivered(ctx, &ferrydriver.DeleteDeliveredParams{Feed: "test/0", Cursor: r.Last, OlderThan: 0, Limit: 1000})
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(10))
	// Nothing undelivered was removed: a reader from the checkpoint still gets the straggler.
	rest := OpenReader(ctx, t, drv, r.Last).ReadQuiet(ctx)
	if lateEv != nil {
		require.Equal(t, []string{lateEv.ID.String()}, ids(rest))
	} else {
		require.Empty(t, rest)
	}
	// Events younger than the window stay.
	emit(ctx, t, h, drv, Event("t", "k", "young"))
	require.Len(t, r.ReadQuiet(ctx), 1+len(rest))
	n, err = drv.DeleteDelivered(ctx, &ferrydriver.DeleteDeliveredParams{Feed: "test/0", Cursor: r.Last, OlderThan: time.Hour, Limit: 1000})
	require.NoError(t, err)
	require.Zero(t, n)
}

func testStatus[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	for i := range 5 {
		emit(ctx, t, h, drv, Event("t", "k", strconv.Itoa(i)))
	}
	st, err := drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: "s/0"})
	require.NoError(t, err)
	require.EqualValues(t, 5, st.LagEvents)
	require.False(t, st.LagEstimated, "below ExactCountLimit the lag is counted")
	require.False(t, st.OldestPending.IsZero())
	require.Nil(t, st.Lease)
	lag, err := drv.FeedLag(ctx, &ferrydriver.FeedLagParams{Feed: "s/0"})
	require.NoError(t, err)
	require.EqualValues(t, 5, lag.Events)
	require.False(t, lag.Estimated)
	require.Equal(t, st.OldestPending, lag.OldestPending)
	require.False(t, lag.Now.IsZero())

	l, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: "s/0", Holder: "r1", TTL: time.Minute})
	require.NoError(t, err)
	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "s/0"})
	require.NoError(t, err)
	defer f.Close()
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 3, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Events, 3)
	require.NoError(t, drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: "s/0", Cursor: b.Cursor, Holder: "r1", Term: l.Term}))
	st, err = drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: "s/0"})
	require.NoError(t, err)
	require.EqualValues(t, 2, st.LagEvents)
	require.Equal(t, "r1", st.Lease.Holder)
	require.Equal(t, l.Term, st.Checkpoint.Term)
	require.Zero(t, st.DeadLetters)
	require.False(t, st.DeadLettersMore)
	lag, err = drv.FeedLag(ctx, &ferrydriver.FeedLagParams{Feed: "s/0"})
	require.NoError(t, err)
	require.EqualValues(t, 2, lag.Events, "FeedLag measures from the saved checkpoint")
	exact, err := drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: "s/0", Exact: true})
	require.NoError(t, err)
	require.EqualValues(t, 2, exact.LagEvents)
	require.False(t, exact.LagEstimated)

	err = drv.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: "s/0", Holder: "r1", Term: l.Term,
		DeadLetters: []*ferrydriver.DeadLetter{{Event: *Event("t", "k", "bad"), Reason: "unroutable"}}})
	require.NoError(t, err)
	for _, exact := range []bool{false, true} {
		st, err = drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: "s/0", Exact: exact})
		require.NoError(t, err)
		require.EqualValues(t, 1, st.DeadLetters)
		require.False(t, st.DeadLettersMore)
	}
}

// testLagEstimate: beyond ExactCountLimit events the lag is extrapolated
// from the first ExactCountLimit, at a cost that does not grow with the
// backlog; it stays in the right range, and Exact still counts it all.
func testLagEstimate[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	drv := h.New(t)
	const calls, per = 25, ferrydriver.ExactCountLimit / 10
	for c := range calls {
		var evs []*ferryevent.Event
		for i := range per {
			evs = append(evs, Event("t", "k"+strconv.Itoa(i%7), strconv.Itoa(c*per+i)))
		}
		require.NoError(t, drv.Append(ctx, &ferrydriver.AppendParams{Events: evs}))
		time.Sleep(2 * time.Millisecond) // backends that position by append time see distinct times
	}
	lag, err := drv.FeedLag(ctx, &ferrydriver.FeedLagParams{Feed: "big/0"})
	require.NoError(t, err)
	require.True(t, lag.Estimated, "%d events: more than ExactCountLimit", calls*per)
	require.InEpsilon(t, calls*per, lag.Events, 0.5, "the estimate is in the right range")
	require.False(t, lag.OldestPending.IsZero())
	st, err := drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: "big/0", Exact: true})
	require.NoError(t, err)
	require.False(t, st.LagEstimated)
	require.EqualValues(t, calls*per, st.LagEvents)
}

// testRetentionSlowestFeed: two feeds read one partition; retention driven
// by the fast one keeps what the slow one has not read.
func testRetentionSlowestFeed[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	var evs []*ferryevent.Event
	for i := range 10 {
		evs = append(evs, Event("t", "k", strconv.Itoa(i)))
	}
	save := func(feed string, cursor []byte) {
		l, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: feed, Holder: "h", TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: cursor, Holder: "h", Term: l.Term}))
	}
	emit(ctx, t, h, drv, evs[:5]...)
	slow := OpenReader(ctx, t, drv, nil)
	require.Len(t, slow.ReadQuiet(ctx), 5)
	save("slow/0", slow.Last)
	emit(ctx, t, h, drv, evs[5:]...)
	fast := OpenReader(ctx, t, drv, nil)
	require.Len(t, fast.ReadQuiet(ctx), 10)
	emit(ctx, t, h, drv, Event("t", "k", "tick")) // one more batch so the fast cursor's Low passes all ten
	require.Len(t, fast.ReadQuiet(ctx), 1)
	save("fast/0", fast.Last)
	_, err := drv.DeleteDelivered(ctx, &ferrydriver.DeleteDeliveredParams{Feed: "fast/0", Cursor: fast.Last, OlderThan: 0, Limit: 1000})
	require.NoError(t, err)
	rest := OpenReader(ctx, t, drv, slow.Last).ReadQuiet(ctx)
	require.Len(t, rest, 6, "the slow feed still gets everything after its checkpoint")
}

// seqOf returns the Seq of the event with payload in evs.
func seqOf(t *testing.T, evs []*ferryevent.Event, key, payload string) int64 {
	t.Helper()
	for _, e := range evs {
		if e.Key == key && string(e.Payload) == payload {
			return e.Seq
		}
	}
	t.Fatalf("no event %s/%s among %d", key, payload, len(evs))
	return 0
}

// testPruneKeys: after retention, the sequence of a key that is idle and
// whose events were all delivered is forgotten, and its next event starts
// again at Seq 1, after the key's earlier events; a key written while the
// pruner runs is never forgotten under its writer; a key with an event not
// yet delivered, or not idle for long enough, is kept.
func testPruneKeys[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	emit(ctx, t, h, drv, Event("t", "idle", "1"), Event("t", "idle", "2"), Event("t", "busy", "1"))
	time.Sleep(h.ClockGrain)
	r := OpenReader(ctx, t, drv, nil)
	require.Len(t, r.ReadQuiet(ctx), 3)
	time.Sleep(5 * time.Millisecond) // clocks of millisecond precision see the next events as later
	emit(ctx, t, h, drv, Event("t", "tick", "1"))
	require.Len(t, r.ReadQuiet(ctx), 1)
	// Retention as the relay runs it: published events first (MongoDB
	// forgets a key only once none of its events is left in the outbox).
	_, err := drv.DeleteDelivered(ctx, &ferrydriver.DeleteDeliveredParams{Feed: "test/0", Cursor: r.Last, Limit: 1000})
	require.NoError(t, err)
	undelivered := Event("t", "pending", "1") // committed after the cursor the pruner is given
	emit(ctx, t, h, drv, undelivered)
	time.Sleep(5 * time.Millisecond)

	res, err := drv.PruneKeys(ctx, &ferrydriver.PruneKeysParams{Cursor: r.Last, IdleFor: time.Hour, Limit: 1000})
	require.NoError(t, err)
	require.Zero(t, res.Pruned, "no key has been idle for an hour")

	// A writer of "busy" is in flight while the pruner runs.
	tx := h.Begin(ctx, t, drv)
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{Event("t", "busy", "2")}}))
	type result struct {
		res *ferrydriver.PruneKeysResult
		err error
	}
	pruned := make(chan result, 1)
	go func() {
		res, err := drv.PruneKeys(ctx, &ferrydriver.PruneKeysParams{Cursor: r.Last, Limit: 1000})
		pruned <- result{res, err}
	}()
	var got result
	select {
	case got = <-pruned: // PostgreSQL skips the locked key
	case <-time.After(300 * time.Millisecond): // SQLite waits for the writer, MongoDB for its transaction
	}
	require.NoError(t, tx.Commit())
	if got.res == nil && got.err == nil {
		got = <-pruned
	}
	require.NoError(t, got.err)
	require.GreaterOrEqual(t, got.res.Pruned, int64(1), "the idle, delivered key is forgotten")
	require.Empty(t, got.res.Next, "one call swept every key")

	emit(ctx, t, h, drv, Event("t", "idle", "3"), Event("t", "busy", "3"), Event("t", "pending", "2"))
	evs := r.ReadQuiet(ctx)
	require.EqualValues(t, 1, seqOf(t, evs, "idle", "3"), "a forgotten key starts again at 1")
	require.EqualValues(t, 2, seqOf(t, evs, "busy", "2"))
	require.EqualValues(t, 3, seqOf(t, evs, "busy", "3"), "a key written while the pruner ran is not forgotten under its writer")
	require.EqualValues(t, 2, seqOf(t, evs, "pending", "2"), "a key with an event the cursor had not passed is kept")
	var order []string
	for _, e := range evs {
		if e.Key == "idle" || e.Key == "busy" {
			order = append(order, e.Key+string(e.Payload))
		}
	}
	require.Equal(t, []string{"busy2", "idle3", "busy3"}, order, "the feed keeps commit order across a restarted key")
}

// testPruneKeysSweep: PruneKeys looks at Limit keys per call and says
// where to go on; the sweep ends with Next "".
func testPruneKeysSweep[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	var evs []*ferryevent.Event
	for i := range 7 {
		evs = append(evs, Event("t", "k"+strconv.Itoa(i), ""))
	}
	emit(ctx, t, h, drv, evs...)
	r := OpenReader(ctx, t, drv, nil)
	require.Len(t, r.ReadQuiet(ctx), 7)
	calls, after := 0, ""
	for {
		res, err := drv.PruneKeys(ctx, &ferrydriver.PruneKeysParams{Cursor: r.Last, IdleFor: time.Hour, After: after, Limit: 3})
		require.NoError(t, err)
		calls++
		if res.Next == "" {
			break
		}
		require.Greater(t, res.Next, after, "the sweep moves on")
		after = res.Next
		require.Less(t, calls, 10)
	}
	require.Equal(t, 3, calls, "7 keys, 3 per call")
}
