package ferrymysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryui/ferryuitest"
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
		Exec: func(stmt string) error {
			_, err := tx.ExecContext(ctx, stmt)
			return err
		},
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
		New:        func(t *testing.T) ferrydriver.Driver[*sql.Tx] { return newDriver(t, nil) },
		Begin:      begin,
		ClockGrain: time.Second,
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

func TestInboxIngestClaimSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseInboxIngestClaims(t, func(t *testing.T) ferrydrivertest.IngestClaimDriver[*sql.Tx] { return newDriver(t, nil) })
}

func TestInboxSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseInbox(t, func(t *testing.T) ferrydrivertest.InboxDriver[*sql.Tx] { return newDriver(t, nil) })
}

func TestActivitySuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseActivity(t, ferrydrivertest.ActivityHarness{New: func(t *testing.T) ferrydriver.Admin { return newDriver(t, nil) }})
}

func TestTransactorSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseTransactor(t, func(t *testing.T) ferrydrivertest.TransactorDriver[*sql.Tx] { return newDriver(t, nil) })
}

// TestConsumerSuite runs a ferry.Consumer over the MariaDB inbox in every
// mode the suite has: one event per transaction, and batches with
// savepoints on failure and always.
func TestConsumerSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseConsumer(t, ferrydrivertest.ConsumerHarness[*sql.Tx]{
		New: func(t *testing.T) ferrydrivertest.InboxDriver[*sql.Tx] { return newDriver(t, nil) },
		Unmigrated: func(t *testing.T) ferrydrivertest.InboxDriver[*sql.Tx] {
			return mysqltest.Open(t, mysqltest.Database(t), nil, false)
		},
		Effects: effects,
	})
}

// effects is the consumer suite's table of handlers' effects, written in
// the handlers' transactions.
func effects(t *testing.T, d ferrydrivertest.InboxDriver[*sql.Tx]) (func(context.Context, *sql.Tx, *ferryevent.Event) error, func(context.Context) (map[uuid.UUID]int, error)) {
	db := d.(*ferrymysql.Driver).DB()
	_, err := db.Exec(`CREATE TABLE effects (n BIGINT AUTO_INCREMENT PRIMARY KEY, event_id BINARY(16) NOT NULL) ENGINE=InnoDB`)
	require.NoError(t, err)
	record := func(ctx context.Context, tx *sql.Tx, ev *ferryevent.Event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (event_id) VALUES (?)`, ev.ID[:])
		return err
	}
	counts := func(ctx context.Context) (map[uuid.UUID]int, error) {
		rows, err := db.QueryContext(ctx, `SELECT event_id, COUNT(*) FROM effects GROUP BY event_id`)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[uuid.UUID]int{}
		for rows.Next() {
			var id []byte
			var n int
			if err := rows.Scan(&id, &n); err != nil {
				return nil, err
			}
			u, err := uuid.FromBytes(id)
			if err != nil {
				return nil, err
			}
			out[u] = n
		}
		return out, rows.Err()
	}
	return record, counts
}

// TestAdminAPISuite runs the admin API (ferryui) over MariaDB.
func TestAdminAPISuite(t *testing.T) {
	t.Parallel()
	drv := newDriver(t, nil)
	ferryuitest.Run(t, drv, drv)
}

// newDriverB is newDriver for benchmarks.
func newDriverB(b *testing.B) *ferrymysql.Driver {
	return mysqltest.Driver(b, &ferrymysql.Config{RecoveryMargin: time.Millisecond})
}
