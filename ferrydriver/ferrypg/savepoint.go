package ferrypg

import (
	"context"
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlSavepoint and sqlRollbackToSavepoint bracket one handler of a batch.
// The savepoint is not released after the handler succeeded (the commit
// releases every one), so that the next handler's nests inside it; a
// failed handler is rolled back to its own, the latest of the name.
const (
	sqlSavepoint           = `SAVEPOINT ferry_event`
	sqlRollbackToSavepoint = `ROLLBACK TO SAVEPOINT ferry_event`
)

// savepointTx is the pgx.Tx a handler of a batch gets: its savepoint is
// not sent on its own but in front of the handler's first statement, in
// one round trip (a pipeline), so that a batched event costs the round
// trips of its handler's own statements and no more; a handler that does
// not touch the database (an unhandled type skipped, a call elsewhere)
// costs none. Every way to the connection (Conn, Begin, CopyFrom, ...)
// sends the savepoint first, so that whatever the handler does in the
// transaction is inside it.
type savepointTx struct {
	pgx.Tx
	// pending: the savepoint is still to be sent.
	pending bool
	// err is the savepoint's own failure: the transaction cannot go on.
	err error
}

// send sends the savepoint now, if it is still pending.
func (t *savepointTx) send(ctx context.Context) error {
	if !t.pending {
		return t.err
	}
	t.pending = false
	if _, err := t.Tx.Exec(ctx, sqlSavepoint); err != nil {
		t.err = err
	}
	return t.err
}

// SendBatch sends b behind the savepoint, if it is still pending (its
// result read here).
func (t *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !t.pending {
		return t.Tx.SendBatch(ctx, b)
	}
	t.pending = false
	all := &pgx.Batch{}
	all.Queue(sqlSavepoint)
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	br := t.Tx.SendBatch(ctx, all)
	if _, err := br.Exec(); err != nil {
		t.err = err
		_ = br.Close()
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

func (t *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.pending && pipelinable(args) {
		return execIn(t.SendBatch(ctx, batchOf(sql, args)))
	}
	if err := t.send(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.pending && pipelinable(args) {
		return queryIn(t.SendBatch(ctx, batchOf(sql, args)))
	}
	if err := t.send(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r, err := t.Query(ctx, sql, args...)
	return errRow{rows: r, err: err}
}

func (t *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.send(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.send(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.send(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

func (t *savepointTx) LargeObjects() pgx.LargeObjects {
	_ = t.send(context.Background())
	return t.Tx.LargeObjects()
}

func (t *savepointTx) Conn() *pgx.Conn {
	_ = t.send(context.Background())
	return t.Tx.Conn()
}

// pipelineRows are the rows of a statement sent behind a savepoint: the
// pipeline closes with them.
type pipelineRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *pipelineRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *pipelineRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	if err := r.br.Close(); err != nil && r.Rows.Err() == nil {
		r.err = err
	}
}

func (r *pipelineRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// errRow is QueryRow over Query, as pgx's own is.
type errRow struct {
	rows pgx.Rows
	err  error
}

func (r errRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// Savepoint implements ferrydriver.InboxBatcher. On a pgx driver fn gets
// a savepointTx: the savepoint travels with fn's first statement. When fn
// fails, the transaction is rolled back to the savepoint if one was sent
// (if none was, fn did nothing in it). On database/sql the savepoint is a
// round trip of its own.
func (d *Driver[TTx]) Savepoint(ctx context.Context, tx TTx, fn func(ctx context.Context, tx TTx) error) error {
	e := d.wrapTx(tx)
	if ptx, ok := any(tx).(pgx.Tx); ok {
		st := &savepointTx{Tx: ptx, pending: true}
		err := fn(ctx, any(st).(TTx))
		switch {
		case st.err != nil:
			return fmt.Errorf("ferrypg: %w: %w", ferrydriver.ErrSavepoint, st.err)
		case err == nil:
			return nil
		case st.pending:
			return err // nothing was sent: nothing to roll back
		}
		if _, rerr := e.exec(context.WithoutCancel(ctx), sqlRollbackToSavepoint); rerr != nil {
			return fmt.Errorf("ferrypg: %w: roll back to it after %v: %w", ferrydriver.ErrSavepoint, err, rerr)
		}
		return err
	}
	if _, err := e.exec(ctx, sqlSavepoint); err != nil {
		return fmt.Errorf("ferrypg: %w: %w", ferrydriver.ErrSavepoint, err)
	}
	if err := fn(ctx, tx); err != nil {
		if _, rerr := e.exec(context.WithoutCancel(ctx), sqlRollbackToSavepoint); rerr != nil {
			return fmt.Errorf("ferrypg: %w: roll back to it after %v: %w", ferrydriver.ErrSavepoint, err, rerr)
		}
		return err
	}
	return nil
}

var _ pgx.Tx = (*savepointTx)(nil)
