package ferrydrivertest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
)

// The partition count stored with the schema (ferrydriver.Store.StoredPartitions).
// A backend that does not implement it says so, and these tests check
// nothing.
func exercisePartitions[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("PartitionCountIsStoredByMigrate", func(t *testing.T) { t.Parallel(); testPartitionsStored(t, h) })
	t.Run("FeedWithAnotherPartitionCountIsRefused", func(t *testing.T) { t.Parallel(); testPartitionsFeedRefused(t, h) })
	t.Run("ProducerWithAnotherPartitionCountWritesNothing", func(t *testing.T) { t.Parallel(); testPartitionsProducerRefused(t, h) })
	t.Run("ProducerFollowsTheStoredPartitionCount", func(t *testing.T) { t.Parallel(); testPartitionsFollowed(t, h) })
	t.Run("PartitionCountChangesOnlyWhenDelivered", func(t *testing.T) { t.Parallel(); testPartitionsChange(t, h) })
}

// partitioned returns a store migrated with Config.Partitions = n.
func partitioned[TTx any](t *testing.T, h Harness[TTx], n int) (ferrydriver.Driver[TTx], func(int) ferrydriver.Driver[TTx]) {
	t.Helper()
	if h.NewPartitioned == nil {
		t.Fatalf("set Harness.NewPartitioned: the suite checks the partition count every store keeps")
	}
	return h.NewPartitioned(t, n)
}

func stored(ctx context.Context, t *testing.T, s ferrydriver.Store) int {
	t.Helper()
	n, err := s.StoredPartitions(ctx)
	require.NoError(t, err)
	return n
}

func testPartitionsStored[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv, open := partitioned(t, h, 4)
	require.Equal(t, 4, stored(ctx, t, drv), "Migrate stores the migrating driver's Config.Partitions")
	require.Equal(t, 4, stored(ctx, t, open(0)))
	require.Equal(t, 1, stored(ctx, t, h.New(t)), "a schema migrated with no count has 1 partition")
	migrated, _ := h.NewPartitioned(t, 0)
	require.Equal(t, 1, stored(ctx, t, migrated))
}

func testPartitionsFeedRefused[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv, open := partitioned(t, h, 4)
	_, err := open(2).OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "test/0"})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured, "a relay configured with 2 partitions on a schema of 4")
	require.ErrorContains(t, err, "Partitions")
	_, err = drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "test/4", Partition: 4})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured, "partition 4 of 4")
	require.ErrorContains(t, err, "out of range")
	for _, s := range []ferrydriver.Store{drv, open(0)} {
		f, err := s.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "test/3", Partition: 3})
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
}

func testPartitionsProducerRefused[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv, open := partitioned(t, h, 4)
	wrong := open(2)
	err := wrong.Append(ctx, []*ferryevent.Event{Event("t", "k", "wrong")})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured)
	require.ErrorContains(t, err, "Partitions")

	tx := h.Begin(ctx, t, wrong)
	err = wrong.AppendTx(ctx, tx.Tx, []*ferryevent.Event{Event("t", "k", "wrong"), Event("t", "k2", "wrong")})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured)
	// Even a caller that commits anyway has written nothing (where the
	// database lets the transaction commit at all).
	_ = tx.Commit()

	right := Event("t", "k", "right")
	require.NoError(t, drv.Append(ctx, []*ferryevent.Event{right}))
	var got []*ferryevent.Event
	for p := range 4 {
		got = append(got, openPartition(ctx, t, drv, p, nil).ReadQuiet(ctx)...)
	}
	require.Equal(t, []string{right.ID.String()}, ids(got), "the refused producer wrote nothing")
	require.EqualValues(t, 1, got[0].Seq, "and used up no sequence number of its key")
}

func testPartitionsFollowed[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	_, open := partitioned(t, h, 4)
	follower := open(0)
	var evs []*ferryevent.Event
	for i := range 40 {
		evs = append(evs, Event("t", "key-"+strconv.Itoa(i%20), strconv.Itoa(i)))
	}
	emit(ctx, t, h, follower, evs[:20]...)
	require.NoError(t, follower.Append(ctx, evs[20:]))
	n := 0
	for p := range 4 {
		for _, ev := range openPartition(ctx, t, follower, p, nil).ReadQuiet(ctx) {
			require.Equal(t, p, ferrydriver.PartitionOf(ev.Key, 4), "key %s", ev.Key)
			n++
		}
	}
	require.Equal(t, 40, n)
}

// testPartitionsChange: the count changes only once no relay holds a feed
// and every feed delivered every event; appends then go by the new count,
// also from a producer that followed the old one, and a producer or relay
// still configured with the old count is refused.
func testPartitionsChange[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	old, open := partitioned(t, h, 4)
	follower := open(0)
	var keys []string
	for i := range 16 {
		keys = append(keys, "key-"+strconv.Itoa(i))
	}
	for _, k := range keys {
		emit(ctx, t, h, follower, Event("t", k, "before"))
	}
	_, err := old.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 8})
	require.ErrorIs(t, err, ferrydriver.ErrPartitionChangeUnsafe, "no feed has read the events")
	require.Equal(t, 4, stored(ctx, t, old))

	// Relays deliver everything and save their checkpoints.
	const holder = "relay"
	var leases []*ferrydriver.Lease
	cursors := map[int][]byte{}
	for p := range 4 {
		name := "test/" + strconv.Itoa(p)
		l, err := old.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: holder, TTL: time.Minute})
		require.NoError(t, err)
		require.True(t, l.Held(holder))
		leases = append(leases, l)
		r := openPartition(ctx, t, old, p, nil)
		r.ReadQuiet(ctx)
		cursors[p] = r.Last
		require.NoError(t, old.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: name, Partition: p, Cursor: r.Last, Holder: holder, Term: l.Term}))
		require.NoError(t, r.Feed.Close())
	}
	_, err = old.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 8})
	require.ErrorIs(t, err, ferrydriver.ErrPartitionChangeUnsafe, "relays still hold their feeds")
	require.ErrorContains(t, err, "test/0")

	// A relay stops; an event comes that it has not delivered.
	for _, l := range leases {
		require.NoError(t, old.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: l.Name, Holder: holder, Term: l.Term}))
	}
	late := Event("t", keys[0], "late")
	emit(ctx, t, h, follower, late)
	_, err = old.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 8})
	require.ErrorIs(t, err, ferrydriver.ErrPartitionChangeUnsafe, "an event is not delivered")
	require.ErrorContains(t, err, "test/"+strconv.Itoa(ferrydriver.PartitionOf(keys[0], 4)))

	p0 := ferrydriver.PartitionOf(keys[0], 4)
	l, err := old.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "test/" + strconv.Itoa(p0), Holder: holder, TTL: time.Minute})
	require.NoError(t, err)
	r := openPartition(ctx, t, old, p0, cursors[p0])
	require.Equal(t, []string{late.ID.String()}, ids(r.ReadQuiet(ctx)))
	cursors[p0] = r.Last
	require.NoError(t, r.Feed.Close())
	require.NoError(t, old.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: l.Name, Partition: p0, Cursor: r.Last, Holder: holder, Term: l.Term}))
	require.NoError(t, old.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: l.Name, Holder: holder, Term: l.Term}))

	prev, err := old.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 8})
	require.NoError(t, err)
	require.Equal(t, 4, prev)
	require.Equal(t, 8, stored(ctx, t, open(0)))

	// The old configuration is refused, by producers and relays.
	err = old.Append(ctx, []*ferryevent.Event{Event("t", keys[1], "stale")})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured)
	_, err = old.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "test/0", Cursor: cursors[0]})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured)

	// The follower, which last wrote with 4, writes with 8 now (where a
	// refused write aborts the transaction, after running it again).
	var after []*ferryevent.Event
	for _, k := range keys {
		ev := Event("t", k, "after")
		after = append(after, ev)
		emitRetrying(ctx, t, h, follower, ev)
	}
	relay := open(8)
	got := map[string]int{}
	for p := range 8 {
		r := openPartition(ctx, t, relay, p, cursors[p])
		for _, ev := range r.ReadQuiet(ctx) {
			require.Equal(t, "after", string(ev.Payload), "partition %d delivers only what came after the change", p)
			require.Equal(t, p, ferrydriver.PartitionOf(ev.Key, 8), "key %s", ev.Key)
			got[ev.ID.String()] = p
		}
	}
	require.Len(t, got, len(after))
	_, err = old.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 0})
	require.Error(t, err, "0 partitions")
}

// emitRetrying is emit, running the transaction again (at most twice) after
// an error Harness.Retryable accepts.
func emitRetrying[TTx any](ctx context.Context, t *testing.T, h Harness[TTx], drv ferrydriver.Driver[TTx], evs ...*ferryevent.Event) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		tx := h.Begin(ctx, t, drv)
		err := drv.AppendTx(ctx, tx.Tx, evs)
		if err == nil {
			err = tx.Commit()
		}
		if err != nil && attempt < 2 && h.Retryable != nil && h.Retryable(err) {
			_ = tx.Rollback()
			continue
		}
		require.NoError(t, err)
		return
	}
}

// openPartition opens feed "test/<p>" of partition p from cursor.
func openPartition(ctx context.Context, t *testing.T, s ferrydriver.Store, p int, cursor []byte) *Reader {
	t.Helper()
	return openReader(ctx, t, s, &ferrydriver.OpenFeedParams{Feed: "test/" + strconv.Itoa(p), Partition: p, Cursor: cursor})
}
