package ferrypg

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// executor is the little that ferrypg needs from a connection, a pool or a
// transaction, so that the same code serves pgx and database/sql users.
type executor interface {
	exec(ctx context.Context, sql string, args ...any) (int64, error)
	query(ctx context.Context, sql string, args ...any) (rows, error)
	// pipeline runs steps in order, each a statement of its own (with its
	// own snapshot at READ COMMITTED), under generic plans, in one round
	// trip where the connection can pipeline (pgx; database/sql runs them
	// one by one, under the session's plans). Each step's rows are read
	// before the next step's error is looked at: a caller learns what the
	// steps before a failure returned, and from a *stepError which step
	// failed. Outside a transaction the steps share one (pgx: an implicit
	// one, committed at its end).
	pipeline(ctx context.Context, steps ...step) error
	// queryCustom is query planned for its arguments every time (pgx: the
	// unnamed statement, described first so that results stay binary,
	// never a cached generic plan), for the console's lists, whose filters
	// ("$3 = '' OR key = $3") only a plan that sees the values can take
	// out: under a generic plan a page of 500 DEAD rows took 50–75 ms, and
	// an event's rows in a group as long (BenchmarkPagesAtScale).
	// database/sql runs query.
	queryCustom(ctx context.Context, sql string, args ...any) (rows, error)
}

// stepError is the error of a pipeline's step (0: the first).
type stepError struct {
	step int
	err  error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// failedStep returns the step of a pipeline that err comes from, -1 when
// none.
func failedStep(err error) int {
	var se *stepError
	if errors.As(err, &se) {
		return se.step
	}
	return -1
}

// step is one statement of a pipeline. scan, when set, is called for each
// row; a step without it is executed and its rows dropped.
type step struct {
	sql  string
	args []any
	scan func(r rows) error
}

// The inbox's statements are many-node CTEs that PostgreSQL plans in about
// a millisecond, several times what running them costs. A prepared
// statement keeps its generic plan once the planner finds it no costlier
// than the custom ones; for these it often does not, and every execution
// paid for a plan of its own, three times the cost of running it under the
// generic plan (docs/benchmarks.md). So a pipeline forces generic plans. A generic plan is made once per session and kept until
// the tables' statistics change, so one made on a new, empty inbox would
// be kept for a while, and with statistics that say "empty" every scan
// looks as cheap as an index: a claim planned so reads the whole inbox to
// claim a few rows. Every access the inbox's
// statements make has an index of its own, so the pipeline also rules out
// sequential and bitmap scans: the plans stay on those indexes whatever the
// statistics said (TestInboxPlansOnAnEmptyInbox). The settings are local
// to the transaction and apply only to the pipeline's own statements: in a
// caller's transaction the last step puts back the ones it had; a pipeline
// on a pool is a transaction of its own, whose end puts them back.
var (
	plannerSettings = [][2]string{{"plan_cache_mode", "force_generic_plan"}, {"enable_seqscan", "off"}, {"enable_bitmapscan", "off"}}
	sqlPlansSet     = plannerSQL(func(name, value string) string {
		return "set_config('ferry." + name + "', current_setting('" + name + "'), true), set_config('" + name + "', '" + value + "', true)"
	})
	sqlPlansRestore = plannerSQL(func(name, _ string) string {
		return "set_config('" + name + "', current_setting('ferry." + name + "'), true)"
	})
)

func plannerSQL(each func(name, value string) string) string {
	parts := make([]string, len(plannerSettings))
	for i, s := range plannerSettings {
		parts[i] = each(s[0], s[1])
	}
	return "SELECT " + strings.Join(parts, ", ")
}

type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// pgxExec adapts pgx.Tx, *pgxpool.Pool and *pgx.Conn.
type pgxExec struct {
	q interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	}
}

func (e pgxExec) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := e.q.Exec(ctx, sql, pgxArgs(args)...)
	return tag.RowsAffected(), err
}

func (e pgxExec) query(ctx context.Context, sql string, args ...any) (rows, error) {
	return e.q.Query(ctx, sql, pgxArgs(args)...)
}

func (e pgxExec) queryCustom(ctx context.Context, sql string, args ...any) (rows, error) {
	return e.q.Query(ctx, sql, append([]any{pgx.QueryExecModeDescribeExec}, pgxArgs(args)...)...)
}

// pgxArgs makes the arguments encodable in every pgx query exec mode. pgx
// encodes a []uuid.UUID (github.com/google/uuid) only into a parameter it
// knows to be uuid[], that is, once the statement was described; under
// default_query_exec_mode=exec or simple_protocol, which a pool behind a
// transaction-pooling PgBouncer may need, it fails ("unable to encode
// []uuid.UUID ... for unknown type (OID 0)"). A []pgtype.UUID it encodes
// in every mode.
func pgxArgs(args []any) []any {
	var out []any
	for i, a := range args {
		ids, ok := a.([]uuid.UUID)
		if !ok {
			continue
		}
		if out == nil {
			out = slices.Clone(args)
		}
		u := make([]pgtype.UUID, len(ids))
		for j, id := range ids {
			u[j] = pgtype.UUID{Bytes: id, Valid: true}
		}
		out[i] = u
	}
	if out == nil {
		return args
	}
	return out
}

func (e pgxExec) pipeline(ctx context.Context, steps ...step) error {
	b := &pgx.Batch{}
	b.Queue(sqlPlansSet)
	for _, s := range steps {
		b.Queue(s.sql, pgxArgs(s.args)...)
	}
	// On a pool the batch is a transaction of its own (one Sync), whose
	// end puts the settings back.
	_, alone := e.q.(*pgxpool.Pool)
	if !alone {
		b.Queue(sqlPlansRestore)
	}
	br := e.q.SendBatch(ctx, b)
	err := readPipeline(br, steps, !alone)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

func readPipeline(br pgx.BatchResults, steps []step, restore bool) error {
	if _, err := br.Exec(); err != nil {
		return &stepError{0, err}
	}
	for i, s := range steps {
		var err error
		if s.scan == nil {
			_, err = br.Exec()
		} else {
			err = scanAll(br.Query, s.scan)
		}
		if err != nil {
			return &stepError{i, err}
		}
	}
	if !restore {
		return nil
	}
	if _, err := br.Exec(); err != nil {
		return &stepError{len(steps) - 1, err}
	}
	return nil
}

// sqlExec adapts *sql.Tx, *sql.DB and *sql.Conn.
type sqlExec struct {
	q interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	}
}

func (e sqlExec) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e sqlExec) query(ctx context.Context, query string, args ...any) (rows, error) {
	r, err := e.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}

func (e sqlExec) queryCustom(ctx context.Context, query string, args ...any) (rows, error) {
	return e.query(ctx, query, args...)
}

func (e sqlExec) pipeline(ctx context.Context, steps ...step) error {
	for i, s := range steps {
		var err error
		if s.scan == nil {
			_, err = e.exec(ctx, s.sql, s.args...)
		} else {
			err = scanAll(func() (rows, error) { return e.query(ctx, s.sql, s.args...) }, s.scan)
		}
		if err != nil {
			return &stepError{i, err}
		}
	}
	return nil
}

// scanAll runs a query (open) and calls scan for each of its rows.
func scanAll[R rows](open func() (R, error), scan func(r rows) error) error {
	r, err := open()
	if err != nil {
		return err
	}
	defer r.Close()
	for r.Next() {
		if err := scan(r); err != nil {
			return err
		}
	}
	r.Close()
	return r.Err()
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// beginner opens the driver's own transactions.
type beginner interface {
	begin(ctx context.Context) (executor, func(context.Context) error, func(context.Context) error, error)
}

type poolBeginner struct{ pool *pgxpool.Pool }

// Ferry's own transactions run at READ COMMITTED whatever the database's
// default_transaction_isolation: their statements count on seeing what
// committed before they started (and lock what they change).

func (b poolBeginner) begin(ctx context.Context) (executor, func(context.Context) error, func(context.Context) error, error) {
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, nil, nil, err
	}
	return pgxExec{tx}, tx.Commit, tx.Rollback, nil
}

type sqlBeginner struct{ db *sql.DB }

func (b sqlBeginner) begin(ctx context.Context) (executor, func(context.Context) error, func(context.Context) error, error) {
	tx, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, nil, nil, err
	}
	return sqlExec{tx}, func(context.Context) error { return tx.Commit() }, func(context.Context) error { return tx.Rollback() }, nil
}

// queryRow runs a query that returns at most one row and scans it.
// It returns pgx.ErrNoRows / sql.ErrNoRows unified as errNoRows.
func queryRow(ctx context.Context, e executor, dest []any, q string, args ...any) error {
	r, err := e.query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer r.Close()
	if !r.Next() {
		if err := r.Err(); err != nil {
			return err
		}
		return errNoRows
	}
	if err := r.Scan(dest...); err != nil {
		return err
	}
	r.Close()
	return r.Err()
}

var errNoRows = errors.New("no rows")

// pgErrCode returns the SQLSTATE of err, or "".
func pgErrCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
