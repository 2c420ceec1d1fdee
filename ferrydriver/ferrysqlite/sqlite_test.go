package ferrysqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
)

func appendOne(ctx context.Context, t *testing.T, drv *ferrysqlite.Driver, key, payload string) *ferryevent.Event {
	t.Helper()
	ev := ferrydrivertest.Event("t", key, payload)
	require.NoError(t, drv.Append(ctx, []*ferryevent.Event{ev}))
	return ev
}

// A second handle on the file stands in for another process: its commits
// cannot signal this driver, and the waiting feed must still see them
// promptly (PRAGMA data_version), not after the whole wait.
func TestFeedSeesOtherHandlesCommits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := filepath.Join(t.TempDir(), "shared.db")
	a, err := ferrysqlite.Open(path, nil)
	require.NoError(t, err)
	defer a.Close()
	_, err = a.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	b, err := ferrysqlite.Open(path, nil)
	require.NoError(t, err)
	defer b.Close()

	f, err := a.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "x/0"})
	require.NoError(t, err)
	defer f.Close()
	got := make(chan *ferrydriver.Batch, 1)
	go func() {
		batch, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 20 * time.Second})
		if err != nil {
			t.Error(err)
		}
		got <- batch
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	ev := appendOne(ctx, t, b, "k", "from the other handle")
	select {
	case batch := <-got:
		require.Len(t, batch.Events, 1)
		require.Equal(t, ev.ID, batch.Events[0].ID)
		t.Logf("seen %v after the other handle's commit", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("a commit through another handle did not wake a feed waiting for 20 s")
	}
}

// Retention may delete every row; ids must not be reused afterwards, or a
// feed positioned past them would skip new events.
func TestIDsAreNotReusedAfterRetention(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv := newDriver(t)
	for i := range 5 {
		appendOne(ctx, t, drv, "k", string(rune('a'+i)))
	}
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	require.Len(t, r.ReadQuiet(ctx), 5)
	n, err := drv.DeleteDelivered(ctx, &ferrydriver.DeleteDeliveredParams{Feed: "test/0", Cursor: r.Last, Limit: 100})
	require.NoError(t, err)
	require.EqualValues(t, 5, n)
	ev := appendOne(ctx, t, drv, "k", "after")
	got := ferrydrivertest.OpenReader(ctx, t, drv, r.Last).ReadQuiet(ctx)
	require.Len(t, got, 1)
	require.Equal(t, ev.ID, got[0].ID)
	require.EqualValues(t, 6, got[0].Seq)
}

func TestMissingSchemaSaysWhatToDo(t *testing.T) {
	drv, err := ferrysqlite.Open(filepath.Join(t.TempDir(), "empty.db"), nil)
	require.NoError(t, err)
	defer drv.Close()
	err = drv.Append(context.Background(), []*ferryevent.Event{ferrydrivertest.Event("t", "k", "")})
	require.ErrorIs(t, err, ferrydriver.ErrSchemaMissing)
	require.Contains(t, err.Error(), "ferry migrate up")
}

func TestForeignCursorIsRejected(t *testing.T) {
	drv := newDriver(t)
	_, err := drv.OpenFeed(context.Background(), &ferrydriver.OpenFeedParams{Feed: "x/0", Cursor: []byte("not json")})
	require.ErrorContains(t, err, "not a SQLite feed cursor")
}

func TestMigrateDownAndUp(t *testing.T) {
	ctx := context.Background()
	drv := newDriver(t)
	all := len(ferrysqlite.Migrations())
	res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true, Steps: all})
	require.NoError(t, err)
	require.Len(t, res.Applied, all)
	require.Zero(t, res.Current)
	res, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{DryRun: true})
	require.NoError(t, err)
	require.Len(t, res.Applied, all)
	res, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	require.Equal(t, ferrysqlite.Migrations()[all-1].Version, res.Current)
	appendOne(ctx, t, drv, "k", "works")
}

// A database of release 0.1 whose consumer stopped with a row claimed
// (stored PROCESSING then; claims live on the key's row since schema 14)
// runs the row again after the upgrade, its counted attempt kept, and the
// key's later row after it.
func TestUpgradeRunsRowsClaimedUnderTheOldSchema(t *testing.T) {
	ctx := context.Background()
	drv := newDriver(t)
	_, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true})
	require.NoError(t, err)
	a, b := ferrydrivertest.Event("t", "k", "a"), ferrydrivertest.Event("t", "k", "b")
	// Written as 0.1 wrote them: a's claim live for an hour, the key
	// waiting for its expiry.
	later := time.Now().Add(time.Hour).UnixMicro()
	for i, ev := range []*ferryevent.Event{a, b} {
		_, err = drv.DB().ExecContext(ctx, `INSERT INTO ferry_inbox (group_name, event_id, key, topic, type, payload, created_at, next_attempt_at, received_at)
			VALUES ('g', ?, 'k', 't', ?, ?, 0, 0, ?)`, ev.ID.String(), ev.Type, ev.Payload, i)
		require.NoError(t, err)
	}
	_, err = drv.DB().ExecContext(ctx, `UPDATE ferry_inbox SET state = 'processing', attempts = 1, claimed_by = 'old', claim_token = 'x',
		claim_expires_at = ? WHERE event_id = ?`, later, a.ID.String())
	require.NoError(t, err)
	_, err = drv.DB().ExecContext(ctx, `INSERT INTO ferry_inbox_keys (group_name, key, runnable_at) VALUES ('g', 'k', ?)`, later)
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)

	ferrydrivertest.RunsClaimedRowsAgain(ctx, t, drv, "g", a, b)
}

func TestOpenRejectsBadInput(t *testing.T) {
	_, err := ferrysqlite.Open(filepath.Join(t.TempDir(), "no", "such", "dir", "x.db"), nil)
	require.ErrorContains(t, err, "create it first")
	_, err = ferrysqlite.Open(filepath.Join(t.TempDir(), "x.db"), &ferrysqlite.Config{Synchronous: "sometimes"})
	require.ErrorContains(t, err, "use FULL, NORMAL or EXTRA")
}

// A write asked for inside a transaction of the single write connection
// fails at once instead of waiting for itself.
func TestWriteInsideItsOwnTransactionFailsFast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drv := newDriver(t)
	err := drv.RunInTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return drv.Append(ctx, []*ferryevent.Event{ferrydrivertest.Event("t", "k", "")})
	})
	require.ErrorIs(t, err, ferrysqlite.ErrWriterHeld)
	require.NoError(t, ctx.Err(), "it did not wait")
}

// Feeds have connections of their own: many open feeds leave the read
// pool to everything else.
func TestManyFeedsDoNotStarveReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drv, err := ferrysqlite.Open(filepath.Join(t.TempDir(), "f.db"), &ferrysqlite.Config{ReadConns: 2, Partitions: 8})
	require.NoError(t, err)
	defer drv.Close()
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	for p := range 8 {
		f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "f/" + strconv.Itoa(p), Partition: p})
		require.NoError(t, err)
		defer f.Close()
	}
	_, err = drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: "f/0"})
	require.NoError(t, err)
}

// Migration 004 on a database that predates it stores the migrating
// driver's count, or, with none, the count the outbox already uses.
func TestPartitionsMigrationKeepsAnOutboxsCount(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct{ configured, want int }{{0, 3}, {5, 5}} {
		drv, err := ferrysqlite.Open(filepath.Join(t.TempDir(), "old.db"), &ferrysqlite.Config{Partitions: tc.configured})
		require.NoError(t, err)
		defer drv.Close()
		_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{Steps: 3})
		require.NoError(t, err)
		_, err = drv.DB().ExecContext(ctx, `INSERT INTO ferry_outbox (partition, event_id, topic, key, seq, type, payload, created_at)
			VALUES (2, 'x', 't', 'k', 1, 'T', x'', 0)`)
		require.NoError(t, err)
		res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{})
		require.NoError(t, err)
		require.Equal(t, len(drv.Migrations()), res.Current)
		n, err := drv.StoredPartitions(ctx)
		require.NoError(t, err)
		require.Equal(t, tc.want, n, "configured %d", tc.configured)
	}
	require.Contains(t, ferrysqlite.Migrations()[3].Up, "NULLIF(0, 0)")
	require.Contains(t, ferrysqlite.MigrationsFor(&ferrysqlite.Config{Partitions: 8})[3].Up, "NULLIF(8, 0)")

	drv := newDriver(t)
	for { // down to before 004, whatever comes after it
		res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true})
		require.NoError(t, err)
		require.NotEmpty(t, res.Applied)
		if res.Applied[0].Version <= 4 {
			break
		}
	}
	err := drv.Append(ctx, []*ferryevent.Event{ferrydrivertest.Event("t", "k", "")})
	require.ErrorIs(t, err, ferrydriver.ErrSchemaMissing)
	require.ErrorContains(t, err, "migration 004")
}

// A stuck key's parked events are not delivered, though the feed's
// checkpoint has passed them: the partition count cannot change.
func TestPartitionsChangeWaitsForParkedEvents(t *testing.T) {
	ctx := context.Background()
	drv := newDriver(t)
	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "relay", TTL: time.Minute})
	require.NoError(t, err)
	ev := ferrydrivertest.Event("t", "stuck", "")
	require.NoError(t, drv.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: "default/0", Holder: "relay", Term: l.Term, Events: []*ferryevent.Event{ev}, Reason: "503"}))
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "relay", Term: l.Term}))
	_, err = drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 2})
	require.ErrorIs(t, err, ferrydriver.ErrPartitionChangeUnsafe)
	require.ErrorContains(t, err, "feed default/0 has 1 parked event(s)")

	l, err = drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "relay", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.UnparkEvent(ctx, &ferrydriver.UnparkEventParams{Feed: "default/0", Holder: "relay", Term: l.Term, Key: "stuck", EventID: ev.ID}))
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "relay", Term: l.Term}))
	_, err = drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 2})
	require.NoError(t, err)
}
