package ferrypg

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// AttemptTx implements txdriver.Transactor. The transaction takes its
// transaction ID first, so that a commit whose answer is lost can be
// resolved with pg_xact_status.
func (d *Driver[TTx]) AttemptTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	tx, commit, rollback, err := d.beginTx(ctx, d.cfg.TxIsolation)
	if err != nil {
		return err
	}
	var xid string
	if err := queryRow(ctx, d.wrapTx(tx), []any{&xid}, `SELECT pg_current_xact_id()::text`); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := fn(ctx, tx); err != nil {
		if isConnError(err) || pgconn.SafeToRetry(err) {
			// It reads like a lost connection; but the callback's own I/O
			// (a JSON decoder, an HTTP client) says the same. Ask the
			// transaction's connection.
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_, perr := d.wrapTx(tx).exec(pctx, `SELECT 1`)
			cancel()
			var pgErr *pgconn.PgError
			if perr == nil || errors.As(perr, &pgErr) {
				err = &callbackIOError{err: err} // alive: not the transaction's error
			}
		}
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			return err // the transaction had failed before COMMIT: the server rolled it back
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && definitive(pgErr) {
			return err // the server answered: rolled back (a serialization failure at commit, say)
		}
		// Anything else may have happened after COMMIT reached the server,
		// whatever the error claims (pgx reports a connection it closed
		// while waiting for COMMIT's answer as safe to retry): ask.
		return &txdriver.CommitUnknownError{Token: xid, Err: err}
	}
	return nil
}

// definitive reports whether an error answering COMMIT means it did not
// happen. A FATAL or PANIC (the session was terminated, the server shut
// down), a connection-class error (08, from a pooler) or an operator
// intervention (57P0x) can come after the commit record was written.
func definitive(e *pgconn.PgError) bool {
	if e.Severity == "FATAL" || e.Severity == "PANIC" {
		return false
	}
	return !strings.HasPrefix(e.Code, "08") && !strings.HasPrefix(e.Code, "57P0")
}

var relationRE = regexp.MustCompile(`relation "([^"]+)"`)

// ClassifyTxError implements txdriver.Transactor: serialization
// failures (40001) and deadlocks (40P01) run again, and so does a
// transaction whose connection broke before COMMIT (it rolled back).
func (d *Driver[TTx]) ClassifyTxError(err error) txdriver.ErrorInfo {
	var cb *callbackIOError
	if errors.As(err, &cb) {
		return txdriver.ErrorInfo{Class: txdriver.Permanent, Cause: "callback_error"}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		info := txdriver.ErrorInfo{Cause: pgErr.Code, Relation: pgErr.TableName}
		switch {
		case !definitive(pgErr):
			// The session ended (terminated, server shutdown): its
			// transaction rolled back with it.
			info.Class, info.Cause = txdriver.Retry, "connection_lost"
		case conflictCause(pgErr) != "":
			info.Class, info.Cause = txdriver.Retry, conflictCause(pgErr)
		}
		if info.Relation == "" {
			for _, s := range []string{pgErr.Where, pgErr.Message, pgErr.Detail} {
				if m := relationRE.FindStringSubmatch(s); m != nil {
					info.Relation = m[1]
					break
				}
			}
		}
		if pgErr.Where != "" && info.Class == txdriver.Retry {
			info.Key = pgErr.Where // "while updating tuple (0,1) in relation ..."
		}
		return info
	}
	var pc *partitionsChangedError
	if errors.As(err, &pc) {
		return txdriver.ErrorInfo{Class: txdriver.Retry, Cause: "partitions_changed", Relation: pc.schema + ".settings"}
	}
	var cu *txdriver.CommitUnknownError
	if errors.As(err, &cu) {
		return txdriver.ErrorInfo{Class: txdriver.CommitUnknown, Cause: "commit_unknown"}
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return txdriver.ErrorInfo{Class: txdriver.Permanent, Cause: "commit_rolled_back"}
	}
	if isConnError(err) || pgconn.SafeToRetry(err) {
		return txdriver.ErrorInfo{Class: txdriver.Retry, Cause: "connection_lost"}
	}
	return txdriver.ErrorInfo{Class: txdriver.Permanent}
}

// isConnError reports a broken connection (the transaction on it is gone).
func isConnError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	return errors.As(err, &netErr) || errors.As(err, &connectErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, net.ErrClosed)
}

// conflictCause names the conflict err reports, a serialization failure
// (40001) or a deadlock (40P01), which rolled the transaction back and
// lets it run again; "" for any other error.
func conflictCause(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001":
			return "serialization_failure"
		case "40P01":
			return "deadlock_detected"
		}
	}
	return ""
}

// callbackIOError is a connection-like error (io.EOF, a net.Error) that
// the callback returned while the transaction's own connection was fine:
// the callback's own I/O failed, and running it again is its call
// (ferry.RerunTx), not the transaction's.
type callbackIOError struct{ err error }

func (e *callbackIOError) Error() string { return e.err.Error() }
func (e *callbackIOError) Unwrap() error { return e.err }

// ResolveCommit implements txdriver.Transactor with pg_xact_status:
// it waits while the transaction is still in progress (its backend may
// not have seen the connection close yet), then reports the outcome.
func (d *Driver[TTx]) ResolveCommit(ctx context.Context, e *txdriver.CommitUnknownError) (txdriver.Outcome, error) {
	if e.Token == "" {
		return txdriver.OutcomeUnknown, nil
	}
	for {
		var status *string
		err := queryRow(ctx, d.db, []any{&status}, `SELECT pg_xact_status($1::text::xid8)`, e.Token)
		if err != nil {
			return txdriver.OutcomeUnknown, d.wrapErr("read the status of transaction "+e.Token, err)
		}
		switch {
		case status == nil:
			return txdriver.OutcomeUnknown, nil // too old to tell
		case *status == "committed":
			return txdriver.Committed, nil
		case *status == "aborted":
			return txdriver.Aborted, nil
		}
		select {
		case <-ctx.Done():
			return txdriver.OutcomeUnknown, fmt.Errorf("ferrypg: transaction %s still in progress: %w", e.Token, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ClaimRequestTx implements txdriver.Transactor.
func (d *Driver[TTx]) ClaimRequestTx(ctx context.Context, tx TTx, p *txdriver.ClaimRequestParams) error {
	n, err := d.wrapTx(tx).exec(ctx, d.queries.requestClaim, p.ID, p.Fingerprint)
	if err != nil {
		return d.wrapErr("record request "+p.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("ferrypg: request %s: %w", p.ID, txdriver.ErrRequestExists)
	}
	return nil
}

// FinishRequestTx implements txdriver.Transactor.
func (d *Driver[TTx]) FinishRequestTx(ctx context.Context, tx TTx, p *txdriver.FinishRequestParams) error {
	if _, err := d.wrapTx(tx).exec(ctx, d.queries.requestFinish, p.ID, p.Result); err != nil {
		return d.wrapErr("store the result of request "+p.ID, err)
	}
	return nil
}

// GetRequest implements txdriver.Transactor.
func (d *Driver[TTx]) GetRequest(ctx context.Context, id string) (*txdriver.RequestRecord, error) {
	rec := &txdriver.RequestRecord{ID: id}
	err := queryRow(ctx, d.db, []any{&rec.Fingerprint, &rec.Result, &rec.CreatedAt}, d.queries.requestGet, id)
	if isNoRows(err) {
		return nil, fmt.Errorf("ferrypg: request %s: %w", id, ferrydriver.ErrNotFound)
	}
	if err != nil {
		return nil, d.wrapErr("read request "+id, err)
	}
	return rec, nil
}

// DeleteRequests implements txdriver.Transactor.
func (d *Driver[TTx]) DeleteRequests(ctx context.Context, p *txdriver.DeleteRequestsParams) (int64, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	n, err := d.db.exec(ctx, d.queries.requestDelete, p.OlderThan.Milliseconds(), limit)
	if err != nil {
		return 0, d.wrapErr("delete old request records", err)
	}
	return n, nil
}

var _ txdriver.Transactor[pgx.Tx] = (*Driver[pgx.Tx])(nil)
var _ txdriver.Transactor[*sql.Tx] = (*Driver[*sql.Tx])(nil)
