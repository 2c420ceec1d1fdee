package ferrypg_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestPartitionsMigrationKeepsAnOutboxsCount: migration 004 on a schema
// that predates it stores the migrating driver's count, or, with none, the
// count the outbox already uses; it reverts and applies again.
func TestPartitionsMigrationKeepsAnOutboxsCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := ferrypgtest.Pool(t)
	for _, tc := range []struct {
		configured, want int
	}{{0, 4}, {6, 6}} {
		schema := ferrypgtest.Schema(t)
		drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema, Partitions: tc.configured})
		require.NoError(t, err)
		_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{Steps: 3})
		require.NoError(t, err)
		// Four relays ran; partition 2 has an event.
		_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.checkpoints (feed, partition, cursor) VALUES ('default/0', 0, NULL), ('default/3', 3, NULL)`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.outbox (partition, event_id, topic, key, seq, type, payload, created_at)
			VALUES (2, gen_random_uuid(), 't', 'k', 1, 'T', '', now())`)
		require.NoError(t, err)
		res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{})
		require.NoError(t, err)
		require.Equal(t, len(drv.Migrations()), res.Current)
		n, err := drv.StoredPartitions(ctx)
		require.NoError(t, err)
		require.Equal(t, tc.want, n, "configured %d", tc.configured)

		// Revert down to before 004, whatever comes after it.
		for {
			res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true})
			require.NoError(t, err)
			require.NotEmpty(t, res.Applied)
			if res.Applied[0].Version <= 4 {
				require.Equal(t, 4, res.Applied[0].Version)
				break
			}
		}
		_, err = drv.StoredPartitions(ctx)
		require.ErrorIs(t, err, ferrydriver.ErrSchemaMissing)
		require.ErrorContains(t, err, "ferry migrate up")
		_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
		require.NoError(t, err)
		n, err = drv.StoredPartitions(ctx)
		require.NoError(t, err)
		require.Equal(t, tc.want, n)
	}

	ms, err := ferrypg.MigrationsFor(&ferrypg.Config{Schema: "app", Partitions: 8})
	require.NoError(t, err)
	require.Contains(t, ms[3].Up, "NULLIF(8, 0)")
	ms, err = ferrypg.Migrations("app")
	require.NoError(t, err)
	require.Contains(t, ms[3].Up, "NULLIF(0, 0)", "printed without a count, the migration keeps the outbox's")
	require.NotContains(t, ms[3].Up, "{")
}

// TestPartitionsChangeUnderARepeatableReadProducer: a producer whose
// snapshot was taken before the count changed sees no stored count at all
// (not the old one): it writes nothing and is told to run again.
func TestPartitionsChangeUnderARepeatableReadProducer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newDriver(t, nil)
	tx, err := ferrypgtest.Pool(t).BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT count(*) FROM `+drv.Schema()+`.checkpoints`) // the snapshot
	require.NoError(t, err)

	_, err = drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 3})
	require.NoError(t, err)

	err = drv.AppendTx(ctx, tx, []*ferryevent.Event{ferrydrivertest.Event("t", "k", "")})
	require.Error(t, err)
	require.Contains(t, err.Error(), "run the transaction again")
	require.Equal(t, txdriver.Retry, drv.ClassifyTxError(err).Class, "ferry.RunTx runs it again")
	require.NoError(t, tx.Commit(ctx))
	var n int
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+drv.Schema()+`.outbox`).Scan(&n))
	require.Zero(t, n)
}

// TestPartitionsChangeWaitsForProducers: a producer transaction that has
// appended and not ended holds the change back; the change gives up after
// its lock timeout, saying to stop the producers. Force skips the checks,
// not the lock.
func TestPartitionsChangeWaitsForProducers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newDriver(t, nil)
	tx, err := ferrypgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, drv.AppendTx(ctx, tx, []*ferryevent.Event{ferrydrivertest.Event("t", "k", "")}))

	start := time.Now()
	_, err = drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 2, Force: true})
	require.ErrorIs(t, err, ferrydriver.ErrPartitionChangeUnsafe)
	require.ErrorContains(t, err, "stop the producers")
	t.Logf("gave up after %v", time.Since(start))
	require.NoError(t, tx.Commit(ctx))

	_, err = drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 2})
	require.ErrorIs(t, err, ferrydriver.ErrPartitionChangeUnsafe)
	require.ErrorContains(t, err, "partition 0 has events and no feed has read it")
	prev, err := drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 2, Force: true})
	require.NoError(t, err)
	require.Equal(t, 1, prev)
	n, err := drv.StoredPartitions(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

// TestPartitionsChangeSeesTheProducersItWaitedFor: the change waits for a
// producer transaction that appended, and then sees its event, even on a
// database whose default isolation is REPEATABLE READ (whose snapshot,
// taken before the wait, would not).
func TestPartitionsChangeSeesTheProducersItWaitedFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := ferrypgtest.Pool(t)
	sep := "?"
	if strings.Contains(ferrypgtest.URL(), "?") {
		sep = "&"
	}
	db, err := sql.Open("pgx", ferrypgtest.URL()+sep+"default_transaction_isolation=repeatable%20read")
	require.NoError(t, err)
	defer db.Close()
	drv, err := ferrypg.NewSQL(db, &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)

	producer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = producer.Rollback(ctx) }()
	other, err := ferrypg.New(pool, &ferrypg.Config{Schema: drv.Schema()})
	require.NoError(t, err)
	require.NoError(t, other.AppendTx(ctx, producer, []*ferryevent.Event{ferrydrivertest.Event("t", "k", "")}))

	done := make(chan error, 1)
	go func() {
		_, err := drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 2})
		done <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE relation = $1::regclass AND NOT granted)`, drv.Schema()+".settings").Scan(&waiting)
		return err == nil && waiting
	}, 4*time.Second, 10*time.Millisecond, "the change waits for the producer")
	require.NoError(t, producer.Commit(ctx))
	err = <-done
	require.ErrorIs(t, err, ferrydriver.ErrPartitionChangeUnsafe)
	require.ErrorContains(t, err, "partition 0 has events and no feed has read it")
}

// TestPartitionsChangeWaitsForParkedEvents: a stuck key's parked events
// are not delivered, though the feed's checkpoint has passed them.
func TestPartitionsChangeWaitsForParkedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newDriver(t, nil)
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

// TestPartitionsChangeWaitsForRelayProcesses: a live ferry.Balancer
// membership is a running relay process, like a feed's lease; a chain
// source's lease is not.
func TestPartitionsChangeWaitsForRelayProcesses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newDriver(t, nil)
	_, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "chain/orders", Holder: "chain", TTL: time.Minute})
	require.NoError(t, err)
	m, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "members/default/host-1", Holder: "host-1", TTL: time.Minute})
	require.NoError(t, err)
	_, err = drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 2})
	require.ErrorIs(t, err, ferrydriver.ErrPartitionChangeUnsafe)
	require.ErrorContains(t, err, "relay host-1 holds lease members/default/host-1")
	require.NotContains(t, err.Error(), "chain/orders")
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: m.Name, Holder: "host-1", Term: m.Term}))
	_, err = drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 2})
	require.NoError(t, err)
}
