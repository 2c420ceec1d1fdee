package ferrymysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// A relay's lease transactions (acquire, renew, and the fenced writes:
// checkpoints, dead letters, parked events) lock the lease's row over
// several round trips. On PostgreSQL each is one statement, which the
// server finishes whatever the client does; here, a relay that stops
// between two statements (SIGSTOP, a frozen VM, a partition that drops its
// packets but not its TCP connection) would keep the row locked for as
// long as its connection lives, and the standby that should take over once
// the lease expires would wait on the lock instead, for
// innodb_lock_wait_timeout (50 s by default) and again after that.
//
// So these transactions run on a connection whose idle_transaction_timeout
// is leaseLockGuard: MariaDB ends a connection that stays idle that long
// inside a transaction, which rolls the transaction back and frees the
// row. A relay that wakes up finds its connection gone and its write
// undone, and then that its lease is lost. The guard is set for the
// transaction only: the connection goes back to the pool as it came, so
// an application's or a consumer's transactions on the same pool are
// never cut short.

// leaseLockGuard is how long, in seconds (MariaDB's unit), a guarded
// transaction may stay idle before the server ends its connection. It is
// at most the shortest lease TTL (1 s) and long past any pause between the
// statements of a running relay.
const leaseLockGuard = 1

var (
	sqlGuardOn  = fmt.Sprintf("SET SESSION idle_transaction_timeout = %d", leaseLockGuard)
	sqlGuardOff = "SET SESSION idle_transaction_timeout = DEFAULT"
)

// guardedWrite runs fn in a transaction (the pool's isolation) on a
// connection guarded by leaseLockGuard, and commits it. A server without
// idle_transaction_timeout (MySQL) runs it unguarded.
func (d *Driver) guardedWrite(ctx context.Context, op string, fn func(tx *sql.Tx) error) (err error) {
	if d.unguarded.Load() {
		return d.write(ctx, op, fn)
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ferrydriver.ErrTxNotBegun, d.wrapErr(op, err))
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, sqlGuardOn); err != nil {
		if errNumber(err) == errUnknownSysVar {
			d.unguarded.Store(true)
			_ = conn.Close()
			return d.write(ctx, op, fn)
		}
		return fmt.Errorf("%w: %w", ferrydriver.ErrTxNotBegun, d.wrapErr(op, err))
	}
	defer func() {
		// Outside the transaction the guard does nothing; it must not
		// follow the connection back to the pool, though. A connection
		// whose guard could not be lifted is closed instead.
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), sqlGuardOff); rerr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	tx, err := conn.BeginTx(ctx, nil)
	return d.inTx(op, tx, err, fn)
}
