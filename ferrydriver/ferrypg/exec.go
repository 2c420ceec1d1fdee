package ferrypg

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// executor is the little that ferrypg needs from a connection, a pool or a
// transaction, so that the same code serves pgx and database/sql users.
type executor interface {
	exec(ctx context.Context, sql string, args ...any) (int64, error)
	query(ctx context.Context, sql string, args ...any) (rows, error)
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
	}
}

func (e pgxExec) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := e.q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (e pgxExec) query(ctx context.Context, sql string, args ...any) (rows, error) {
	return e.q.Query(ctx, sql, args...)
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
