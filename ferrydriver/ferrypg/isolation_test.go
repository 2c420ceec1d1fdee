package ferrypg_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
)

// repeatableReadPool returns a pool whose sessions default to REPEATABLE
// READ, as after ALTER DATABASE … SET default_transaction_isolation =
// 'repeatable read' (without changing the shared test database).
func repeatableReadPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ferrypgtest.Pool(t) // skips, or fails under CI=true, without a server
	cfg, err := pgxpool.ParseConfig(ferrypgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var iso string
	require.NoError(t, pool.QueryRow(context.Background(), `SHOW default_transaction_isolation`).Scan(&iso))
	require.Equal(t, "repeatable read", iso)
	return pool
}

func driverOn(t *testing.T, pool *pgxpool.Pool, cfg ferrypg.Config) *ferrypg.Driver[pgx.Tx] {
	t.Helper()
	cfg.Schema = ferrypgtest.Schema(t)
	drv, err := ferrypg.New(pool, &cfg)
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv
}

// The inbox suite on a database whose default is REPEATABLE READ, with the
// handlers' transactions at the default isolation (READ COMMITTED) and at
// REPEATABLE READ.
func TestInboxSuiteRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	pool := repeatableReadPool(t)
	for _, iso := range []ferrypg.Isolation{"", ferrypg.RepeatableRead} {
		name := "handlers at the default isolation"
		if iso != "" {
			name = "handlers at " + string(iso)
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ferrydrivertest.ExerciseInbox(t, func(t *testing.T) ferrydrivertest.InboxDriver[pgx.Tx] {
				return driverOn(t, pool, ferrypg.Config{InboxIsolation: iso})
			})
		})
	}
}

// TestCompletionSeesADeliveryAfterItsSnapshot: a key's next event arrives
// after the handler's transaction took its snapshot and before it
// completes. Under REPEATABLE READ the completion used to find the key
// empty and mark it idle, stranding the new event; now the key runs it.
func TestCompletionSeesADeliveryAfterItsSnapshot(t *testing.T) {
	t.Parallel()
	pool := repeatableReadPool(t)
	for _, iso := range []ferrypg.Isolation{"", ferrypg.RepeatableRead, ferrypg.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			drv := driverOn(t, pool, ferrypg.Config{InboxIsolation: iso})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			first := ferrydrivertest.Event("t", "k", "first")
			second := ferrydrivertest.Event("t", "k", "second")
			_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{first}})
			require.NoError(t, err)
			rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 10, TTL: time.Minute})
			require.NoError(t, err)
			require.Len(t, rows, 1)
			var once sync.Once
			runs := 0
			require.NoError(t, drv.RunInTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				runs++
				if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot
					return err
				}
				var ierr error
				once.Do(func() {
					_, ierr = drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{second}})
				})
				if ierr != nil {
					return ierr
				}
				return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: rows[0].Event.ID, Claim: rows[0].Claim})
			}))
			var next []*ferrydriver.InboxRow
			require.Eventually(t, func() bool {
				next, err = drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 10, TTL: time.Minute})
				require.NoError(t, err)
				return len(next) == 1
			}, 5*time.Second, 20*time.Millisecond, "the key's new event is not stranded (handler transaction ran %d times)", runs)
			require.Equal(t, second.ID, next[0].Event.ID)
			t.Logf("isolation %q: the handler's transaction ran %d times", iso, runs)
		})
	}
}

// TestRunTxDoesNotRerunTheCallbacksOwnIOErrors: an io.EOF or a net.Error
// that the callback's own I/O returned (its connection to the database is
// fine) is the callback's error, returned at once; RerunTx opts in.
func TestRunTxDoesNotRerunTheCallbacksOwnIOErrors(t *testing.T) {
	t.Parallel()
	drv := newDriver(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, own := range []error{io.EOF, io.ErrUnexpectedEOF, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, net.ErrClosed} {
		calls := 0
		_, err := ferry.RunTx(ctx, drv, nil, func(ctx context.Context, tx pgx.Tx) (int, error) {
			calls++
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return 0, err
			}
			return 0, fmt.Errorf("decode the partner's answer: %w", own)
		})
		require.ErrorIs(t, err, own)
		require.Equal(t, 1, calls, "%v: the callback's own error does not rerun it", own)
	}
	calls := 0
	_, err := ferry.RunTx(ctx, drv, nil, func(ctx context.Context, tx pgx.Tx) (int, error) {
		calls++
		if calls == 1 {
			return 0, ferry.RerunTx(io.EOF)
		}
		return 0, nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, calls, "RerunTx asks for it")

	// The transaction's own connection lost: run again.
	calls = 0
	_, err = ferry.RunTx(ctx, drv, nil, func(ctx context.Context, tx pgx.Tx) (int, error) {
		calls++
		if calls == 1 {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return 0, err
		}
		return 0, nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, calls, "a lost connection reruns the callback")
}
