// Package ferrydrivertest is the behavioural suite every Ferry backend must
// pass. A backend's tests call Exercise with a Harness that makes fresh,
// isolated, migrated stores on a real server.
//
// The suite branches on ferrydriver.Capabilities explicitly; a capability a
// backend lacks is reported with t.Log, never skipped silently.
package ferrydrivertest

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
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
	t.Run("KeySeqsGoWithTheCheckpoint", func(t *testing.T) { t.Parallel(); testKeySeqs(t, h) })
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
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, evs))
	require.NoError(t, tx.Commit())
}

// Reader drains a feed for tests. Where the store leaves Seq to the relay
// (ferrydriver.KeySeqStore), the Reader stands in for it: it checks that
// every event arrives without a Seq and numbers each key's events in the
// order the feed returns them, going on from where the reader it resumes
// left off; elsewhere it checks that every event arrives numbered.
type Reader struct {
	t    *testing.T
	Feed ferrydriver.Feed
	Last []byte
	// seqs is each key's last Seq, where the Reader numbers.
	seqs map[string]int64
}

// OpenReader opens partition 0 of a store from cursor.
func OpenReader(ctx context.Context, t *testing.T, s ferrydriver.Store, cursor []byte) *Reader {
	t.Helper()
	return openReader(ctx, t, s, &ferrydriver.OpenFeedParams{Feed: "test/0", Cursor: cursor})
}

func openReader(ctx context.Context, t *testing.T, s ferrydriver.Store, p *ferrydriver.OpenFeedParams) *Reader {
	t.Helper()
	f, err := s.OpenFeed(ctx, p)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	r := &Reader{t: t, Feed: f, Last: p.Cursor}
	if _, ok := s.(ferrydriver.KeySeqStore); ok {
		r.seqs = map[string]int64{}
	}
	return r
}

// Resume opens partition 0 of s from where r stopped (its Last cursor and,
// where it numbers, its keys' numbers), as a new leader does from a
// checkpoint.
func (r *Reader) Resume(ctx context.Context, s ferrydriver.Store) *Reader {
	r.t.Helper()
	next := OpenReader(ctx, r.t, s, r.Last)
	if r.seqs != nil {
		next.seqs = maps.Clone(r.seqs)
	}
	return next
}

// Read reads one batch, numbered as described at Reader.
func (r *Reader) Read(ctx context.Context, p *ferrydriver.ReadParams) (*ferrydriver.Batch, error) {
	b, err := r.Feed.Read(ctx, p)
	if err != nil {
		return nil, err
	}
	for _, ev := range b.Events {
		if r.seqs == nil {
			require.NotZero(r.t, ev.Seq, "event %s (key %q) arrived without a Seq from a store that numbers events itself", ev.ID, ev.Key)
			continue
		}
		require.Zero(r.t, ev.Seq, "event %s (key %q) arrived with a Seq from a store that leaves Seq to the relay", ev.ID, ev.Key)
		r.seqs[ev.Key]++
		ev.Seq = r.seqs[ev.Key]
	}
	r.Last = b.Cursor
	return b, nil
}

// ReadN reads until n events arrived or ctx ends.
func (r *Reader) ReadN(ctx context.Context, n int) []*ferryevent.Event {
	r.t.Helper()
	var out []*ferryevent.Event
	for len(out) < n {
		b, err := r.Read(ctx, &ferrydriver.ReadParams{Max: 100, Wait: 50 * time.Millisecond})
		require.NoError(r.t, err, "read feed after %d of %d events", len(out), n)
		out = append(out, b.Events...)
	}
	return out
}

// ReadQuiet reads until a read returns nothing, and returns what it read.
func (r *Reader) ReadQuiet(ctx context.Context) []*ferryevent.Event {
	r.t.Helper()
	var out []*ferryevent.Event
	empty := 0
	for empty < 2 {
		b, err := r.Read(ctx, &ferrydriver.ReadParams{Max: 100, Wait: 20 * time.Millisecond})
		require.NoError(r.t, err)
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

func testLease[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	const name = "lease/0"
	a, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "a", TTL: time.Second})
	require.NoError(t, err)
	require.True(t, a.Held("a"))
	require.EqualValues(t, 1, a.Term)

	b, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "b", TTL: time.Second})
	require.NoError(t, err)
	require.Equal(t, "a", b.Holder, "b must be denied while a holds the lease")
	require.False(t, b.Held("b"))

	again, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "a", TTL: time.Second})
	require.NoError(t, err)
	require.EqualValues(t, 1, again.Term, "re-acquiring a held lease keeps the term")

	_, err = drv.RenewLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "a", Term: 1, TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "b", TTL: time.Minute})
		return err == nil && l.Held("b")
	}, 5*time.Second, 50*time.Millisecond, "b takes over once a's lease expires")
	lb, err := drv.GetLease(ctx, name)
	require.NoError(t, err)
	require.EqualValues(t, 2, lb.Term, "a change of holder increments the term")

	_, err = drv.RenewLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "a", Term: 1, TTL: time.Second})
	require.ErrorIs(t, err, ferrydriver.ErrLeaseLost)

	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "b", Term: 2}))
	c, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "c", TTL: time.Second})
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
	cp, err := drv.LoadCheckpoint(ctx, feed)
	require.NoError(t, err)
	require.Nil(t, cp.Cursor, "a feed never saved has no cursor")

	err = drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: []byte("x"), Holder: "a", Term: 1})
	require.ErrorIs(t, err, ferrydriver.ErrLeaseLost, "saving without holding the lease is rejected")

	a, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "a", TTL: 400 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: []byte("c1"), Holder: "a", Term: a.Term}))
	cp, err = drv.LoadCheckpoint(ctx, feed)
	require.NoError(t, err)
	require.Equal(t, "c1", string(cp.Cursor))
	require.Equal(t, a.Term, cp.Term)

	// a pauses past its TTL; b takes over; a's late write is rejected.
	require.Eventually(t, func() bool {
		l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "b", TTL: time.Minute})
		return err == nil && l.Held("b")
	}, 5*time.Second, 50*time.Millisecond)
	err = drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: []byte("zombie"), Holder: "a", Term: a.Term})
	require.ErrorIs(t, err, ferrydriver.ErrLeaseLost)
	err = drv.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: feed, Holder: "a", Term: a.Term,
		DeadLetters: []*ferrydriver.DeadLetter{{Event: *Event("t", "k", "x"), Reason: "zombie"}}})
	require.ErrorIs(t, err, ferrydriver.ErrLeaseLost)
	cp, err = drv.LoadCheckpoint(ctx, feed)
	require.NoError(t, err)
	require.Equal(t, "c1", string(cp.Cursor), "the zombie's checkpoint must not land")
}
