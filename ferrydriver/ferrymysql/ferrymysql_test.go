package ferrymysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
)

// TestMain checks for leaked goroutines; the shared admin pool of mysqltest
// stays open (its connections each have a watcher).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreTopFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1"))
}

// begin starts a caller transaction on the driver's pool.
func begin(ctx context.Context, t *testing.T, drv ferrydriver.Driver[*sql.Tx]) ferrydrivertest.Tx[*sql.Tx] {
	d := drv.(*ferrymysql.Driver)
	tx, err := d.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	return ferrydrivertest.Tx[*sql.Tx]{
		Tx: tx,
		// InnoDB gives a transaction its id at its first write.
		TakeXID: func() error {
			_, err := tx.ExecContext(ctx, `INSERT INTO test_writes (v) VALUES (1)`)
			return err
		},
		Commit:   tx.Commit,
		Rollback: tx.Rollback,
	}
}

// newDriver is a driver over a fresh, migrated database with a table the
// harness writes to. Its recovery margin is a millisecond, so that
// retention removes what was delivered a moment ago.
func newDriver(t *testing.T, cfg *ferrymysql.Config) *ferrymysql.Driver {
	if cfg == nil {
		cfg = &ferrymysql.Config{RecoveryMargin: time.Millisecond}
	}
	drv := mysqltest.Driver(t, cfg)
	_, err := drv.DB().Exec(`CREATE TABLE test_writes (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB`)
	require.NoError(t, err)
	return drv
}

func TestDriverSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.Exercise(t, ferrydrivertest.Harness[*sql.Tx]{
		New:   func(t *testing.T) ferrydriver.Driver[*sql.Tx] { return newDriver(t, nil) },
		Begin: begin,
		HoldWriter: func(ctx context.Context, t *testing.T) func() {
			drv := newDriver(t, nil)
			tx, err := drv.DB().BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, `INSERT INTO test_writes (v) VALUES (1)`)
			require.NoError(t, err)
			return func() { _ = tx.Rollback() }
		},
		NewPartitioned: func(t *testing.T, n int) (ferrydriver.Driver[*sql.Tx], func(int) ferrydriver.Driver[*sql.Tx]) {
			dsn := mysqltest.Database(t)
			drv := mysqltest.Open(t, dsn, &ferrymysql.Config{Partitions: n, RecoveryMargin: time.Millisecond}, true)
			return drv, func(n int) ferrydriver.Driver[*sql.Tx] {
				return mysqltest.Open(t, dsn, &ferrymysql.Config{Partitions: n, RecoveryMargin: time.Millisecond}, false)
			}
		},
	})
}

// newDriverB is newDriver for benchmarks.
func newDriverB(b *testing.B) *ferrymysql.Driver {
	return mysqltest.Driver(b, &ferrymysql.Config{RecoveryMargin: time.Millisecond})
}
