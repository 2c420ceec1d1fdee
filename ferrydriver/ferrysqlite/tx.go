package ferrysqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"modernc.org/sqlite"
)

// AttemptTx implements txdriver.Transactor: fn runs in a transaction of
// DB(). SQLite's commit either happens or fails in this process, so its
// outcome is never unknown.
func (d *Driver) AttemptTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return d.RunInTx(ctx, fn)
}

// SQLite result codes that mean another writer got in the way; the
// transaction was rolled back and can run again.
const (
	sqliteBusy         = 5
	sqliteLocked       = 6
	sqliteBusySnapshot = 517
)

// ClassifyTxError implements txdriver.Transactor: SQLITE_BUSY (another
// process held the write lock past the busy timeout) and SQLITE_LOCKED run
// again.
func (d *Driver) ClassifyTxError(err error) txdriver.ErrorInfo {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqliteBusy, sqliteLocked:
			return txdriver.ErrorInfo{Class: txdriver.Retry, Cause: "busy"}
		}
		return txdriver.ErrorInfo{Class: txdriver.Permanent, Cause: sqlite.ErrorCodeString[se.Code()]}
	}
	return txdriver.ErrorInfo{Class: txdriver.Permanent}
}

// ResolveCommit implements txdriver.Transactor; AttemptTx never reports
// an unknown commit.
func (d *Driver) ResolveCommit(context.Context, *txdriver.CommitUnknownError) (txdriver.Outcome, error) {
	return txdriver.OutcomeUnknown, nil
}

// ClaimRequestTx implements txdriver.Transactor. With one writer at a
// time, a request recorded by another transaction has committed.
func (d *Driver) ClaimRequestTx(ctx context.Context, tx *sql.Tx, p *txdriver.ClaimRequestParams) error {
	res, err := tx.ExecContext(ctx, `INSERT INTO ferry_requests (id, fingerprint, created_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING`,
		p.ID, p.Fingerprint, micros(now()))
	if err != nil {
		return d.wrapErr("record request "+p.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("ferrysqlite: request %s: %w", p.ID, txdriver.ErrRequestExists)
	}
	return nil
}

// FinishRequestTx implements txdriver.Transactor.
func (d *Driver) FinishRequestTx(ctx context.Context, tx *sql.Tx, p *txdriver.FinishRequestParams) error {
	result := p.Result
	if result == nil {
		result = []byte{}
	}
	_, err := tx.ExecContext(ctx, `UPDATE ferry_requests SET result = ?, finished_at = ? WHERE id = ?`, result, micros(now()), p.ID)
	return d.wrapErr("store the result of request "+p.ID, err)
}

// GetRequest implements txdriver.Transactor.
func (d *Driver) GetRequest(ctx context.Context, id string) (*txdriver.RequestRecord, error) {
	rec := &txdriver.RequestRecord{ID: id}
	var created int64
	err := d.r.QueryRowContext(ctx, `SELECT fingerprint, result, created_at FROM ferry_requests WHERE id = ?`, id).Scan(&rec.Fingerprint, &rec.Result, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("ferrysqlite: request %s: %w", id, ferrydriver.ErrNotFound)
	}
	if err != nil {
		return nil, d.wrapErr("read request "+id, err)
	}
	rec.CreatedAt = fromMicros(created)
	return rec, nil
}

// DeleteRequests implements txdriver.Transactor.
func (d *Driver) DeleteRequests(ctx context.Context, p *txdriver.DeleteRequestsParams) (int64, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	var n int64
	err := d.write(ctx, "delete old request records", func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM ferry_requests WHERE id IN (
    SELECT id FROM ferry_requests WHERE created_at < ? ORDER BY created_at LIMIT ?)`, micros(now())-p.OlderThan.Microseconds(), limit)
		if err != nil {
			return d.wrapErr("delete old request records", err)
		}
		n, _ = res.RowsAffected()
		return nil
	})
	return n, err
}

var _ txdriver.Transactor[*sql.Tx] = (*Driver)(nil)
