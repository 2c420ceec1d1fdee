package ferrypg_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
)

// newDriver returns a pgx driver on a fresh, migrated schema.
func newDriver(t *testing.T, cfg *ferrypg.Config) *ferrypg.Driver[pgx.Tx] {
	t.Helper()
	pool := ferrypgtest.Pool(t)
	c := ferrypg.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = ferrypgtest.Schema(t)
	drv, err := ferrypg.New(pool, &c)
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv
}

func holdWriter(ctx context.Context, t *testing.T) func() {
	pool := ferrypgtest.Pool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	// A write that takes an xid and stays open: the classic stall for
	// readers that wait for the oldest running transaction.
	_, err = tx.Exec(ctx, "SELECT pg_current_xact_id()")
	require.NoError(t, err)
	return func() { _ = tx.Rollback(context.Background()) }
}

func TestDriverSuitePgx(t *testing.T) {
	t.Parallel()
	ferrydrivertest.Exercise(t, ferrydrivertest.Harness[pgx.Tx]{
		New: func(t *testing.T) ferrydriver.Driver[pgx.Tx] { return newDriver(t, nil) },
		Begin: func(ctx context.Context, t *testing.T, _ ferrydriver.Driver[pgx.Tx]) ferrydrivertest.Tx[pgx.Tx] {
			tx, err := ferrypgtest.Pool(t).Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return ferrydrivertest.Tx[pgx.Tx]{
				Tx: tx,
				TakeXID: func() error {
					_, err := tx.Exec(ctx, "SELECT pg_current_xact_id()")
					return err
				},
				Commit:   func() error { return tx.Commit(ctx) },
				Rollback: func() error { return tx.Rollback(ctx) },
				Exec: func(stmt string) error {
					_, err := tx.Exec(ctx, stmt)
					return err
				},
			}
		},
		HoldWriter: holdWriter,
		NewPartitioned: func(t *testing.T, n int) (ferrydriver.Driver[pgx.Tx], func(int) ferrydriver.Driver[pgx.Tx]) {
			drv := newDriver(t, &ferrypg.Config{Partitions: n})
			return drv, func(n int) ferrydriver.Driver[pgx.Tx] {
				other, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: drv.Schema(), Partitions: n})
				require.NoError(t, err)
				return other
			}
		},
	})
}

func TestDriverSuiteDatabaseSQL(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", ferrypgtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ferrypgtest.Pool(t) // skip or fail early when the server is absent
	ferrydrivertest.Exercise(t, ferrydrivertest.Harness[*sql.Tx]{
		New: func(t *testing.T) ferrydriver.Driver[*sql.Tx] {
			drv, err := ferrypg.NewSQL(db, &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
			require.NoError(t, err)
			_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
			require.NoError(t, err)
			return drv
		},
		Begin: func(ctx context.Context, t *testing.T, _ ferrydriver.Driver[*sql.Tx]) ferrydrivertest.Tx[*sql.Tx] {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return ferrydrivertest.Tx[*sql.Tx]{
				Tx: tx,
				TakeXID: func() error {
					_, err := tx.ExecContext(ctx, "SELECT pg_current_xact_id()")
					return err
				},
				Commit:   tx.Commit,
				Rollback: tx.Rollback,
				Exec: func(stmt string) error {
					_, err := tx.ExecContext(ctx, stmt)
					return err
				},
			}
		},
		HoldWriter: holdWriter,
		NewPartitioned: func(t *testing.T, n int) (ferrydriver.Driver[*sql.Tx], func(int) ferrydriver.Driver[*sql.Tx]) {
			schema := ferrypgtest.Schema(t)
			open := func(n int) ferrydriver.Driver[*sql.Tx] {
				drv, err := ferrypg.NewSQL(db, &ferrypg.Config{Schema: schema, Partitions: n})
				require.NoError(t, err)
				return drv
			}
			drv := open(n)
			_, err := drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
			require.NoError(t, err)
			return drv, open
		},
	})
}

func TestActivitySuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseActivity(t, ferrydrivertest.ActivityHarness{New: func(t *testing.T) ferrydriver.Admin { return newDriver(t, nil) }})
}

func TestInboxSuitePgx(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseInbox(t, func(t *testing.T) ferrydrivertest.InboxDriver[pgx.Tx] { return newDriver(t, nil) })
}

func TestInboxIngestClaimSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseInboxIngestClaims(t, func(t *testing.T) ferrydrivertest.IngestClaimDriver[pgx.Tx] { return newDriver(t, nil) })
}

func TestInboxSuiteDatabaseSQL(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", ferrypgtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ferrypgtest.Pool(t)
	ferrydrivertest.ExerciseInbox(t, func(t *testing.T) ferrydrivertest.InboxDriver[*sql.Tx] {
		drv, err := ferrypg.NewSQL(db, &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
		require.NoError(t, err)
		_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
		require.NoError(t, err)
		return drv
	})
}

func TestTransactorSuitePgx(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseTransactor(t, func(t *testing.T) ferrydrivertest.TransactorDriver[pgx.Tx] { return newDriver(t, nil) })
}

func TestTransactorSuiteRepeatableRead(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseTransactor(t, func(t *testing.T) ferrydrivertest.TransactorDriver[pgx.Tx] {
		return newDriver(t, &ferrypg.Config{TxIsolation: ferrypg.RepeatableRead})
	})
}

// TestClassifyTxErrors: serialization failures and deadlocks run again and
// name the contended table; other errors do not.
func TestClassifyTxErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newDriver(t, &ferrypg.Config{TxIsolation: ferrypg.RepeatableRead})
	pool := ferrypgtest.Pool(t)
	table := drv.Schema() + ".hot"
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL); INSERT INTO `+table+` VALUES (1, 0), (2, 0)`)
	require.NoError(t, err)

	// Two REPEATABLE READ transactions update one row: the second fails.
	first, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	second, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = second.Exec(ctx, `SELECT n FROM `+table+` WHERE id = 1`) // take the snapshot
	require.NoError(t, err)
	_, err = first.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = 1`)
	require.NoError(t, err)
	require.NoError(t, first.Commit(ctx))
	_, err = second.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = 1`)
	require.Error(t, err)
	_ = second.Rollback(ctx)
	info := drv.ClassifyTxError(err)
	require.Equal(t, txdriver.Retry, info.Class)
	require.Equal(t, "serialization_failure", info.Cause)

	// A deadlock: each holds one row and wants the other's.
	a, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = a.Rollback(ctx) }()
	b, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = b.Rollback(ctx) }()
	_, err = a.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = 1`)
	require.NoError(t, err)
	_, err = b.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = 2`)
	require.NoError(t, err)
	errs := make(chan error, 2)
	go func() { _, err := a.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = 2`); errs <- err }()
	go func() { _, err := b.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = 1`); errs <- err }()
	// The victim fails; the other then gets its row. Wait for both, so
	// that no Exec still runs on a connection when it is rolled back.
	err, other := <-errs, <-errs
	if err == nil {
		err = other
	}
	info = drv.ClassifyTxError(err)
	require.Equal(t, txdriver.Retry, info.Class, "%v", err)
	require.Equal(t, "deadlock_detected", info.Cause)
	require.Equal(t, "hot", info.Relation)

	require.Equal(t, txdriver.Permanent, drv.ClassifyTxError(errors.New("boom")).Class)
}

func TestConsumerSuitePgx(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseConsumer(t, ferrydrivertest.ConsumerHarness[pgx.Tx]{
		New: func(t *testing.T) ferrydrivertest.InboxDriver[pgx.Tx] { return newDriver(t, nil) },
		Unmigrated: func(t *testing.T) ferrydrivertest.InboxDriver[pgx.Tx] {
			drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
			require.NoError(t, err)
			return drv
		},
		Effects: func(t *testing.T, d ferrydrivertest.InboxDriver[pgx.Tx]) (func(context.Context, pgx.Tx, *ferryevent.Event) error, func(context.Context) (map[uuid.UUID]int, error)) {
			table := pgx.Identifier{d.(*ferrypg.Driver[pgx.Tx]).Schema(), "effects"}.Sanitize()
			_, err := ferrypgtest.Pool(t).Exec(context.Background(), `CREATE TABLE `+table+` (n bigserial PRIMARY KEY, event_id uuid NOT NULL)`)
			require.NoError(t, err)
			record := func(ctx context.Context, tx pgx.Tx, ev *ferryevent.Event) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id) VALUES ($1)`, ev.ID)
				return err
			}
			counts := func(ctx context.Context) (map[uuid.UUID]int, error) {
				rows, err := ferrypgtest.Pool(t).Query(ctx, `SELECT event_id, count(*) FROM `+table+` GROUP BY event_id`)
				if err != nil {
					return nil, err
				}
				out := map[uuid.UUID]int{}
				var id uuid.UUID
				var n int
				_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
				return out, err
			}
			return record, counts
		},
	})
}
