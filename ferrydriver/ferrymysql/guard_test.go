package ferrymysql_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
)

// TestStoppedLeaderFreesTheLease stops a leader's checkpoint write after
// its fence, with the lease's row locked, and lets its lease expire: a
// standby takes the lease over all the same (the server ends the stopped
// transaction's connection), and the leader's write, resumed after that,
// fails and leaves nothing.
func TestStoppedLeaderFreesTheLease(t *testing.T) {
	t.Parallel()
	d := mysqltest.Driver(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const feed = "default/0"
	la, err := d.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "a", TTL: time.Second})
	require.NoError(t, err)
	require.Equal(t, "a", la.Holder)

	fenced, resume := make(chan struct{}), make(chan struct{})
	written := make(chan error, 1)
	go func() {
		written <- d.SaveCheckpointStopped(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: []byte("a's"), Holder: "a", Term: la.Term}, fenced, resume)
	}()
	<-fenced
	stopped := time.Now()

	// Without the guard, b's acquire waits on a's lock for
	// innodb_lock_wait_timeout (50 s), past this deadline.
	bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
	defer bcancel()
	var lb *ferrydriver.Lease
	for {
		lb, err = d.AcquireLease(bctx, &ferrydriver.LeaseParams{Name: feed, Holder: "b", TTL: time.Minute})
		require.NoError(t, err, "b asks for the lease while a's transaction is stopped")
		if lb.Holder == "b" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("b took the lease over %v after a stopped", time.Since(stopped).Round(time.Millisecond))
	require.Greater(t, lb.Term, la.Term)
	require.NoError(t, d.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: []byte("b's"), Holder: "b", Term: lb.Term}))

	close(resume)
	require.Error(t, <-written, "a's write resumed on a connection the server ended")
	cp, err := d.LoadCheckpoint(ctx, feed)
	require.NoError(t, err)
	require.Equal(t, lb.Term, cp.Term)
	require.Equal(t, "b's", string(cp.Cursor))

	// The pool's connections carry no guard afterwards: a transaction
	// idle for longer than it is not ended.
	for range 4 { // more than the pool's idle connections the test used
		tx, err := d.DB().BeginTx(ctx, nil)
		require.NoError(t, err)
		var v int64
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT @@session.idle_transaction_timeout`).Scan(&v))
		require.Zero(t, v)
		require.NoError(t, tx.Rollback())
	}
}
