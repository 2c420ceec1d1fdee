package ferrypg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/jackc/pgx/v5"
)

// inTx runs op in a READ COMMITTED transaction of the driver's own.
func (d *Driver[TTx]) inTx(ctx context.Context, op func(e executor) error) error {
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: begin: %w", err)
	}
	if err := op(e); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := commit(ctx); err != nil {
		return fmt.Errorf("ferrypg: commit: %w", err)
	}
	return nil
}

// RunInTx implements ferrydriver.Inbox: fn runs in a transaction at
// Config.InboxIsolation (READ COMMITTED by default, whatever the
// database's default_transaction_isolation). A serialization failure or a
// deadlock rolls it back and runs fn again (up to ten times), within the
// same claim: under REPEATABLE READ and SERIALIZABLE that is how the inbox
// stays consistent with concurrent deliveries.
func (d *Driver[TTx]) RunInTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	return rerunConflicts(ctx, func() error { return d.runInTxOnce(ctx, fn) })
}

// inRC runs op with an executor whose statements run at READ COMMITTED:
// the pool's sessions when that is their default (as it normally is), a
// READ COMMITTED transaction otherwise (a database whose
// default_transaction_isolation is stricter), at the cost of its BEGIN and
// COMMIT. The inbox's statements count on it: under REPEATABLE READ, a
// row another transaction changed after a statement's snapshot fails the
// statement instead of being read again.
func (d *Driver[TTx]) inRC(ctx context.Context, op func(e executor) error) error {
	if d.sessionsReadCommitted(ctx) {
		return op(d.db)
	}
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: begin: %w", err)
	}
	if err := op(e); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	return commit(ctx)
}

// sessionsReadCommitted reports whether the pool's sessions default to
// READ COMMITTED, asked once (false, and asked again, when asking fails).
func (d *Driver[TTx]) sessionsReadCommitted(ctx context.Context) bool {
	if v := d.sessionsRC.Load(); v != 0 {
		return v == 1
	}
	var iso string
	if err := queryRow(ctx, d.db, []any{&iso}, `SHOW default_transaction_isolation`); err != nil {
		return false
	}
	if iso == "read committed" {
		d.sessionsRC.Store(1)
		return true
	}
	d.sessionsRC.Store(2)
	d.cfg.Logger.Info("ferrypg: the database's default isolation is not READ COMMITTED; the inbox wraps its statements in READ COMMITTED transactions",
		"default_transaction_isolation", iso)
	return false
}

// rerunConflicts runs op again, up to ten times in all, while it fails
// with a serialization failure or a deadlock (which roll back everything).
// The waits grow (5 ms more each time, a random part of it added, so that
// workers that conflicted do not meet again in step): about 300 ms in
// all, longer than a burst of deliveries that keep touching the key rows
// completions lock (a REPEATABLE READ completion conflicts with every one
// committed after its snapshot, by design; see sqlInboxInsert).
func rerunConflicts(ctx context.Context, op func() error) error {
	for attempt := 1; ; attempt++ {
		err := op()
		if err == nil || attempt == 10 || ctx.Err() != nil || conflictCause(err) == "" {
			return err
		}
		wait := time.Duration(attempt)*5*time.Millisecond + rand.N(5*time.Millisecond)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return err
		}
	}
}

func (d *Driver[TTx]) runInTxOnce(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	if d.pool != nil {
		return d.runLazyTx(ctx, fn)
	}
	tx, commit, rollback, err := d.beginTx(ctx, d.cfg.InboxIsolation)
	if err != nil {
		return fmt.Errorf("ferrypg: %w: %w", ferrydriver.ErrTxNotBegun, err)
	}
	if err := fn(ctx, tx); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := commit(ctx); err != nil {
		return fmt.Errorf("ferrypg: commit: %w", err)
	}
	return nil
}

// runLazyTx runs fn in a lazyTx on a connection of the pool: acquiring it
// is the transaction's beginning (ErrTxNotBegun when it fails), and the
// BEGIN goes with the first statement.
func (d *Driver[TTx]) runLazyTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: %w: %w", ferrydriver.ErrTxNotBegun, err)
	}
	defer conn.Release() // a connection left in a transaction is closed, not reused
	tx := &lazyTx{d: d, conn: conn.Conn(), opts: pgx.TxOptions{IsoLevel: pgx.TxIsoLevel(d.cfg.InboxIsolation)}}
	if err := fn(ctx, any(tx).(TTx)); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		var lost *ferrydriver.ClaimsLostError
		if errors.As(err, &lost) {
			return fmt.Errorf("ferrypg: %w", err)
		}
		return fmt.Errorf("ferrypg: commit: %w", err)
	}
	return nil
}
