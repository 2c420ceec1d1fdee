package ferrypg

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// lazyTx is the transaction a pgx driver's RunInTx gives a consumer's
// handlers. A round trip costs CPU on both ends (two system calls and a
// wake-up each side, about what the handler's statement itself costs), and
// a transaction of one event is little else, so none is spent on the
// transaction itself: its BEGIN goes with its first statement, and the
// inbox's record of the outcome (CompleteInboxTx, FinishInboxTx) goes with
// its COMMIT, both in pipelines. An event applied alone then costs two
// round trips (the ceiling, one upsert per transaction, three), whatever
// its handler does in one statement.
//
// The outcome sent with the COMMIT cannot be looked at before it: its
// statement raises when a claim was lost (inbox_claims_held), which makes
// the COMMIT roll back, and Commit then reports a *ClaimsLostError. Every
// way to the connection (Conn, Begin, LargeObjects, ...) begins the
// transaction first.
type lazyTx struct {
	d interface {
		lostClaims(context.Context, executor, *deferredFinish) []uuid.UUID
	}
	conn *pgx.Conn
	opts pgx.TxOptions
	// tx is the transaction once its BEGIN was sent.
	tx pgx.Tx
	// finish is the outcome to record with the COMMIT, if any.
	finish *deferredFinish
	// done: committed, or rolled back.
	done bool
}

// deferredFinish is a finish's statements, to send with the COMMIT, and
// what the rows reported were (to name those lost).
type deferredFinish struct {
	group       string
	ids, claims []uuid.UUID
	steps       []step
}

// begin sends the transaction's BEGIN now, if it is not begun.
func (t *lazyTx) begin(ctx context.Context) error {
	if t.tx != nil {
		return nil
	}
	tx, err := t.conn.BeginTx(ctx, t.opts)
	if err != nil {
		return err
	}
	t.tx = tx
	return nil
}

// pipelinable reports whether a statement with these arguments can go in
// a pipeline: pgx takes a query mode given as the first argument only
// outside one.
func pipelinable(args []any) bool {
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			return false
		}
	}
	return true
}

// SendBatch sends b, behind the BEGIN when the transaction is not begun
// (its result read here).
func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.tx != nil {
		return t.tx.SendBatch(ctx, b)
	}
	all := &pgx.Batch{}
	all.BeginTx(t.opts)
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	br := t.conn.SendBatch(ctx, all)
	t.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.tx == nil && pipelinable(args) {
		return execIn(t.SendBatch(ctx, batchOf(sql, args)))
	}
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, sql, args...)
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.tx == nil && pipelinable(args) {
		return queryIn(t.SendBatch(ctx, batchOf(sql, args)))
	}
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Query(ctx, sql, args...)
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r, err := t.Query(ctx, sql, args...)
	return errRow{rows: r, err: err}
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	if err := t.begin(context.Background()); err != nil {
		// A closed transaction's: every call reports pgx.ErrTxClosed.
		b := &pgx.Batch{}
		b.BeginTx(t.opts)
		return pgx.FailedBatchResults(b, err).Tx().LargeObjects()
	}
	return t.tx.LargeObjects()
}

func (t *lazyTx) Conn() *pgx.Conn {
	_ = t.begin(context.Background()) // the caller's statements on it fail if this did
	return t.conn
}

// Rollback rolls back what was sent; nothing, if nothing was.
func (t *lazyTx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// Commit commits, with the deferred finish if there is one; a transaction
// that sent nothing has nothing to commit.
func (t *lazyTx) Commit(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	if t.finish == nil {
		t.done = true
		if t.tx == nil {
			return nil
		}
		return t.tx.Commit(ctx)
	}
	b := &pgx.Batch{}
	begun := t.tx != nil
	if !begun {
		b.BeginTx(t.opts)
	}
	b.Queue(sqlPlansSet)
	for _, s := range t.finish.steps {
		b.Queue(s.sql, pgxArgs(s.args)...)
	}
	b.Queue("commit")
	var br pgx.BatchResults
	if begun {
		br = t.tx.SendBatch(ctx, b)
	} else {
		br = t.conn.SendBatch(ctx, b)
		t.tx = br.Tx()
	}
	err := readCommit(br, !begun, t.finish.steps)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		t.done = true
		return nil
	}
	if s := t.conn.PgConn().TxStatus(); s == 'T' || s == 'E' {
		// A statement before the COMMIT failed: it was not run.
		_ = t.tx.Rollback(context.WithoutCancel(ctx))
	}
	t.done = true
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == claimsLostCode {
		return &ferrydriver.ClaimsLostError{Lost: t.d.lostClaims(ctx, pgxExec{t.conn}, t.finish)}
	}
	return err
}

// claimsLostCode is the SQLSTATE of inbox_claims_held's error.
const claimsLostCode = "YF001"

// readCommit reads the results of a commit pipeline: BEGIN (if sent), the
// planner settings, the finish's steps, COMMIT.
func readCommit(br pgx.BatchResults, begin bool, steps []step) error {
	if begin {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	if _, err := br.Exec(); err != nil {
		return err
	}
	for _, s := range steps {
		var err error
		if s.scan == nil {
			_, err = br.Exec()
		} else {
			err = scanAll(br.Query, s.scan)
		}
		if err != nil {
			return err
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("ferrypg: commit: %w", err)
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// deferFinish reports whether tx sends its finish with its COMMIT, and if
// so keeps f for it.
func deferFinish(tx any, f *deferredFinish) bool {
	t, ok := tx.(*lazyTx)
	if !ok || t.done || t.finish != nil {
		return false
	}
	t.finish = f
	return true
}

// lostClaims names, after a finish sent with the COMMIT rolled back for a
// lost claim, the rows whose claims were lost (read anew: it is what the
// caller acts on, and a claim may have moved since).
func (d *Driver[TTx]) lostClaims(ctx context.Context, e executor, f *deferredFinish) []uuid.UUID {
	var lost []uuid.UUID
	err := e.pipeline(ctx, step{sql: d.queries.inboxLostClaims, args: []any{f.group, f.ids, f.claims}, scan: func(r rows) error {
		var id uuid.UUID
		if err := r.Scan(&id); err != nil {
			return err
		}
		lost = append(lost, id)
		return nil
	}})
	if err != nil || len(lost) == 0 {
		// Unknown which: all of them (the caller runs none of them again;
		// they are rescued if their claims still hold).
		lost = append(lost[:0], f.ids...)
	}
	return lost
}

func batchOf(sql string, args []any) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(sql, pgxArgs(args)...)
	return b
}

// execIn reads the next result of br as an Exec and closes br.
func execIn(br pgx.BatchResults) (pgconn.CommandTag, error) {
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// queryIn reads the next result of br as a Query; br closes with the rows.
func queryIn(br pgx.BatchResults) (pgx.Rows, error) {
	r, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &pipelineRows{Rows: r, br: br}, nil
}

var _ pgx.Tx = (*lazyTx)(nil)
