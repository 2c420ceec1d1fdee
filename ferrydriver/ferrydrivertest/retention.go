package ferrydrivertest

import (
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
)

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
		require.NoError(t, drv.AppendTx(ctx, straggler.Tx, []*ferryevent.Event{lateEv}))
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

	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "s/0", Holder: "r1", TTL: time.Minute})
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
		require.NoError(t, drv.Append(ctx, evs))
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
		l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "h", TTL: time.Minute})
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
	if _, ok := drv.(ferrydriver.KeySeqStore); ok {
		t.Logf("%s's producers keep no key sequences: the relay forgets its own (KeySeqsGoWithTheCheckpoint)", drv.Name())
		return
	}
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
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, []*ferryevent.Event{Event("t", "busy", "2")}))
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
	if _, ok := drv.(ferrydriver.KeySeqStore); ok {
		t.Logf("%s's producers keep no key sequences: the relay forgets its own (KeySeqsGoWithTheCheckpoint)", drv.Name())
		return
	}
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
