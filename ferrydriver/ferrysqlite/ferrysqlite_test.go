package ferrysqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryui/ferryuitest"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newDriver opens a migrated database in a fresh file.
func newDriver(t *testing.T) *ferrysqlite.Driver {
	t.Helper()
	drv, err := ferrysqlite.Open(filepath.Join(t.TempDir(), "ferry.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, drv.Close()) })
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv
}

func TestDriverSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.Exercise(t, ferrydrivertest.Harness[*sql.Tx]{
		New: func(t *testing.T) ferrydriver.Driver[*sql.Tx] { return newDriver(t) },
		Begin: func(ctx context.Context, t *testing.T, drv ferrydriver.Driver[*sql.Tx]) ferrydrivertest.Tx[*sql.Tx] {
			tx, err := drv.(*ferrysqlite.Driver).DB().BeginTx(ctx, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return ferrydrivertest.Tx[*sql.Tx]{Tx: tx, Commit: tx.Commit, Rollback: tx.Rollback, Exec: func(stmt string) error {
				_, err := tx.ExecContext(ctx, stmt)
				return err
			}}
		},
		NewPartitioned: func(t *testing.T, n int) (ferrydriver.Driver[*sql.Tx], func(int) ferrydriver.Driver[*sql.Tx]) {
			path := filepath.Join(t.TempDir(), "ferry.db")
			open := func(n int) ferrydriver.Driver[*sql.Tx] {
				drv, err := ferrysqlite.Open(path, &ferrysqlite.Config{Partitions: n})
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, drv.Close()) })
				return drv
			}
			drv := open(n)
			_, err := drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
			require.NoError(t, err)
			return drv, open
		},
	})
}

func TestInboxSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseInbox(t, func(t *testing.T) ferrydrivertest.InboxDriver[*sql.Tx] { return newDriver(t) })
}

func TestInboxIngestClaimSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseInboxIngestClaims(t, func(t *testing.T) ferrydrivertest.IngestClaimDriver[*sql.Tx] { return newDriver(t) })
}

func TestActivitySuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseActivity(t, ferrydrivertest.ActivityHarness{New: func(t *testing.T) ferrydriver.Admin { return newDriver(t) }})
}

func TestTransactorSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseTransactor(t, func(t *testing.T) ferrydrivertest.TransactorDriver[*sql.Tx] { return newDriver(t) })
}

func TestConsumerSuite(t *testing.T) {
	t.Parallel()
	ferrydrivertest.ExerciseConsumer(t, ferrydrivertest.ConsumerHarness[*sql.Tx]{
		New: func(t *testing.T) ferrydrivertest.InboxDriver[*sql.Tx] { return newDriver(t) },
		Unmigrated: func(t *testing.T) ferrydrivertest.InboxDriver[*sql.Tx] {
			drv, err := ferrysqlite.Open(filepath.Join(t.TempDir(), "empty.db"), nil)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, drv.Close()) })
			return drv
		},
		Effects: func(t *testing.T, d ferrydrivertest.InboxDriver[*sql.Tx]) (func(context.Context, *sql.Tx, *ferryevent.Event) error, func(context.Context) (map[uuid.UUID]int, error)) {
			db := d.(*ferrysqlite.Driver).DB()
			_, err := db.Exec(`CREATE TABLE effects (n INTEGER PRIMARY KEY, event_id TEXT NOT NULL)`)
			require.NoError(t, err)
			record := func(ctx context.Context, tx *sql.Tx, ev *ferryevent.Event) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO effects (event_id) VALUES (?)`, ev.ID.String())
				return err
			}
			counts := func(ctx context.Context) (map[uuid.UUID]int, error) {
				rows, err := db.QueryContext(ctx, `SELECT event_id, count(*) FROM effects GROUP BY event_id`)
				if err != nil {
					return nil, err
				}
				defer rows.Close()
				out := map[uuid.UUID]int{}
				for rows.Next() {
					var id string
					var n int
					if err := rows.Scan(&id, &n); err != nil {
						return nil, err
					}
					out[uuid.MustParse(id)] = n
				}
				return out, rows.Err()
			}
			return record, counts
		},
	})
}

// TestAdminAPISuite runs the admin API (ferryui) over SQLite.
func TestAdminAPISuite(t *testing.T) {
	t.Parallel()
	drv := newDriver(t)
	ferryuitest.Run(t, drv, drv)
}
