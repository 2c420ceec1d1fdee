package ferrypg_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/internal/pgtest"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
)

// newDriver returns a pgx driver on a fresh, migrated schema.
func newDriver(t *testing.T, cfg *ferrypg.Config) *ferrypg.Driver[pgx.Tx] {
	t.Helper()
	pool := pgtest.Pool(t)
	c := ferrypg.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = pgtest.Schema(t)
	drv, err := ferrypg.New(pool, &c)
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv
}

func holdWriter(ctx context.Context, t *testing.T) func() {
	pool := pgtest.Pool(t)
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
			tx, err := pgtest.Pool(t).Begin(ctx)
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
			}
		},
		HoldWriter: holdWriter,
	})
}

func TestDriverSuiteDatabaseSQL(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	pgtest.Pool(t) // skip or fail early when the server is absent
	ferrydrivertest.Exercise(t, ferrydrivertest.Harness[*sql.Tx]{
		New: func(t *testing.T) ferrydriver.Driver[*sql.Tx] {
			drv, err := ferrypg.NewSQL(db, &ferrypg.Config{Schema: pgtest.Schema(t)})
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
			}
		},
		HoldWriter: holdWriter,
	})
}

func TestInboxSuitePgx(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseInbox(t, func(t *testing.T) ferrydrivertest.InboxDriver[pgx.Tx] { return newDriver(t, nil) })
}

func TestInboxSuiteDatabaseSQL(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	pgtest.Pool(t)
	ferrydrivertest.ExerciseInbox(t, func(t *testing.T) ferrydrivertest.InboxDriver[*sql.Tx] {
		drv, err := ferrypg.NewSQL(db, &ferrypg.Config{Schema: pgtest.Schema(t)})
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
