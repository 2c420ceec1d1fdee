package ferrypg

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// countingExec counts the statements a session sends.
type countingExec struct {
	executor
	n *atomic.Int64
}

func (c countingExec) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	c.n.Add(1)
	return c.executor.exec(ctx, sql, args...)
}

func (c countingExec) query(ctx context.Context, sql string, args ...any) (rows, error) {
	c.n.Add(1)
	return c.executor.query(ctx, sql, args...)
}

// TestAwaitSettledDoesNotPoll: waiting costs a fixed number of statements
// (LISTEN on the shared hub, register, one read, and removing the waiter at
// the end), whatever the wait lasts; a processed event is answered from its
// notification without another query.
func TestAwaitSettledDoesNotPoll(t *testing.T) {
	t.Parallel()
	drv := newTestDriver(t)
	var statements atomic.Int64
	open := drv.session
	drv.session = func(ctx context.Context) (*session, error) {
		s, err := open(ctx)
		if err == nil {
			s.exec = countingExec{s.exec, &statements}
		}
		return s, err
	}
	ctx := context.Background()
	a, b := ferrydrivertest.Event("t", "a", "a"), ferrydrivertest.Event("t", "b", "b")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{a, b}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 10, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	drv.db = countingExec{drv.db, &statements} // completions run in their own transactions, not through db

	done := make(chan map[uuid.UUID]*ferrydriver.InboxRow, 1)
	go func() {
		st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{a.ID, b.ID}, Deadline: time.Now().Add(10 * time.Second)})
		require.NoError(t, err)
		done <- st
	}()
	// 3, and more once per listening session: checkSession's
	// pg_backend_pid() (two on the session, one on the pool, three times).
	checks := 3 * sessionChecks
	require.Eventually(t, func() bool { return statements.Load() == int64(3+checks) }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(700 * time.Millisecond) // a poller would query meanwhile
	require.EqualValues(t, 3+checks, statements.Load(), "waiting issues no queries")

	for _, r := range rows {
		require.NoError(t, drv.RunInTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: r.Event.ID, Claim: r.Claim})
		}))
	}
	committed := time.Now()
	st := <-done
	latency := time.Since(committed)
	require.Equal(t, ferrydriver.InboxProcessed, st[a.ID].State)
	require.Equal(t, ferrydriver.InboxProcessed, st[b.ID].State)
	require.EqualValues(t, 4+checks, statements.Load(), "processed events are answered from their notifications (the last statement removes the waiter)")
	t.Logf("settled %v after the last commit", latency)
}
