package ferrymysql

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"time"
)

// The driver's own transactions on the consumer side (claims, failures,
// ingestion, redrives) run at READ COMMITTED: each statement reads what is
// committed when it starts, and InnoDB takes no gap locks for their reads
// and updates, only record locks (the rows they change, the rows they lock
// by key). A deadlock (1213) or a lock wait timeout (1205) runs the whole
// transaction again: InnoDB rolled a deadlock's transaction back, and a
// timeout's statement only (innodb_rollback_on_timeout is off by
// default), so the transaction is rolled back here before it runs again,
// never continued.

// maxTxRuns bounds how often a transaction runs when InnoDB keeps
// choosing it as a deadlock's victim.
const maxTxRuns = 10

// rerunnable reports an error after which a transaction runs again from
// its start: a deadlock (rolled back) or a lock wait timeout (this
// statement rolled back; the rest is rolled back by the caller).
func rerunnable(err error) bool {
	switch errNumber(err) {
	case errDeadlock, errLockWait:
		return true
	}
	return false
}

// rerunPause is the pause before run n (from 2) of a transaction that lost
// a race: jittered, up to about 50 ms.
func rerunPause(n int) time.Duration {
	d := time.Millisecond << min(n, 6)
	return d/2 + rand.N(d/2+1)
}

// writeRC runs fn in a READ COMMITTED transaction of the pool and commits
// it, running it again after a deadlock or a lock wait timeout. A
// transaction that cannot begin fails with ferrydriver.ErrTxNotBegun.
func (d *Driver) writeRC(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	return d.runTx(ctx, op, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(_ context.Context, tx *sql.Tx) error { return fn(tx) })
}

// runTx runs fn in a transaction (opts: its isolation; nil: the pool's)
// and commits it, running it again from its start after a deadlock or a
// lock wait timeout, at most maxTxRuns times.
func (d *Driver) runTx(ctx context.Context, op string, opts *sql.TxOptions, fn func(ctx context.Context, tx *sql.Tx) error) error {
	for run := 1; ; run++ {
		err := d.runTxOnce(ctx, op, opts, fn)
		if err == nil || !rerunnable(err) || run == maxTxRuns || ctx.Err() != nil {
			return err
		}
		d.reruns.Add(1)
		t := time.NewTimer(rerunPause(run + 1))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func (d *Driver) runTxOnce(ctx context.Context, op string, opts *sql.TxOptions, fn func(ctx context.Context, tx *sql.Tx) error) error {
	tx, err := d.db.BeginTx(ctx, opts)
	return d.inTx(op, tx, err, func(tx *sql.Tx) error { return fn(ctx, tx) })
}

// errTxGone is CompleteInboxTx's finding that the handler's transaction
// was no longer open: InnoDB rolled it back (a deadlock the handler's code
// did not return), and what ran after that committed statement by
// statement.
var errTxGone = errors.New("the handler's transaction was rolled back before the event was marked processed (a deadlock or lock wait timeout that the handler did not return?); statements after it ran outside the transaction")
