package ferrymysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
)

// RunTx's transactions (txdriver.Transactor) run at the pool's
// isolation. What MySQL's errors mean for them:
//   - a deadlock (1213) rolled the transaction back: run it again;
//   - a lock wait timeout (1205) rolled back the statement only (unless
//     innodb_rollback_on_timeout is on): AttemptTx rolls the rest back,
//     and it runs again;
//   - a COMMIT that got no answer (the connection broke after it was sent)
//     may have committed: it is never run again blindly. When the
//     transaction claimed a request record, ResolveCommit waits for the
//     session that sent the COMMIT to end (killing it if it lingers), then
//     reads the record on another connection: there with this attempt's
//     token, it committed; otherwise it did not. Without a request record
//     nothing can tell (MySQL has no transaction status to ask, and a
//     plain COMMIT is not in XA RECOVER), and RunTx returns
//     ferry.ErrCommitUnknown.

// attemptState is what an attempt's callback recorded for ResolveCommit:
// the request it claimed, the token it stored with it, the session.
type attemptState struct {
	mu      sync.Mutex
	request string
	token   uuid.UUID
	conn    int64
}

// attempts maps an open AttemptTx transaction to its state.
var attempts sync.Map // *sql.Tx → *attemptState

// AttemptTx implements txdriver.Transactor.
func (d *Driver) AttemptTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%w: %w", ferrydriver.ErrTxNotBegun, d.wrapErr("begin a transaction", err))
	}
	defer func() { _ = tx.Rollback() }() // fn panicked (after a commit: sql.ErrTxDone)
	st := &attemptState{}
	attempts.Store(tx, st)
	defer attempts.Delete(tx)
	if err := fn(ctx, tx); err != nil {
		return err
	}
	err = tx.Commit()
	if err == nil || errNumber(err) != 0 || errors.Is(err, sql.ErrTxDone) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The server answered; or COMMIT was never sent (the transaction
		// had ended, the connection was found broken before a byte went
		// out, ctx ended first): the outcome is known.
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	token := ""
	if st.request != "" {
		token = strconv.FormatInt(st.conn, 10) + "/" + st.token.String() + "/" + st.request
	}
	return &txdriver.CommitUnknownError{Token: token, Err: err}
}

// ClassifyTxError implements txdriver.Transactor.
func (d *Driver) ClassifyTxError(err error) txdriver.ErrorInfo {
	var cu *txdriver.CommitUnknownError
	if errors.As(err, &cu) {
		return txdriver.ErrorInfo{Class: txdriver.CommitUnknown, Cause: "commit_unknown"}
	}
	switch n := errNumber(err); n {
	case errDeadlock:
		return txdriver.ErrorInfo{Class: txdriver.Retry, Cause: "deadlock"}
	case errLockWait:
		return txdriver.ErrorInfo{Class: txdriver.Retry, Cause: "lock_wait_timeout"}
	case 0:
	default:
		return txdriver.ErrorInfo{Class: txdriver.Permanent, Cause: "mysql_" + strconv.Itoa(int(n))}
	}
	if errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) {
		// The transaction's connection broke before COMMIT: the server
		// rolls it back.
		return txdriver.ErrorInfo{Class: txdriver.Retry, Cause: "connection_lost"}
	}
	return txdriver.ErrorInfo{Class: txdriver.Permanent}
}

// ResolveCommit implements txdriver.Transactor (see above).
func (d *Driver) ResolveCommit(ctx context.Context, e *txdriver.CommitUnknownError) (txdriver.Outcome, error) {
	parts := strings.SplitN(e.Token, "/", 3)
	if len(parts) != 3 {
		return txdriver.OutcomeUnknown, nil // no request record to read
	}
	conn, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return txdriver.OutcomeUnknown, nil
	}
	token, err := uuid.Parse(parts[1])
	if err != nil {
		return txdriver.OutcomeUnknown, nil
	}
	if err := d.awaitSessionEnd(ctx, conn); err != nil {
		return txdriver.OutcomeUnknown, err
	}
	var stored []byte
	err = d.db.QueryRowContext(ctx, `SELECT attempt FROM ferry_requests WHERE id = ?`, parts[2]).Scan(&stored)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return txdriver.Aborted, nil
	case err != nil:
		return txdriver.OutcomeUnknown, d.wrapErr("read request "+parts[2], err)
	case string(stored) == string(token[:]):
		return txdriver.Committed, nil
	}
	return txdriver.Aborted, nil // another attempt's (a concurrent duplicate's) record
}

// awaitSessionEnd waits until session id has ended: its transaction then
// committed or rolled back for good. A session still there after a
// moment (the server has not noticed the broken connection) is killed.
func (d *Driver) awaitSessionEnd(ctx context.Context, id int64) error {
	start := time.Now()
	killed := false
	for {
		var n int
		if err := d.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?`, id).Scan(&n); err != nil {
			return d.wrapErr(fmt.Sprintf("look for session %d", id), err)
		}
		if n == 0 {
			return nil
		}
		if !killed && time.Since(start) > 200*time.Millisecond {
			killed = true
			if _, err := d.db.ExecContext(ctx, `KILL CONNECTION `+strconv.FormatInt(id, 10)); err != nil && errNumber(err) != 1094 { // 1094: no such thread
				return d.wrapErr(fmt.Sprintf("end session %d", id), err)
			}
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("ferrymysql: session %d, whose COMMIT got no answer, has not ended: %w", id, ctx.Err())
		case <-t.C:
		}
	}
}

// ClaimRequestTx implements txdriver.Transactor: the record is
// inserted in tx; a committed one makes the insert fail (duplicate key),
// and one whose transaction is still open makes it wait for that
// transaction's end.
func (d *Driver) ClaimRequestTx(ctx context.Context, tx *sql.Tx, p *txdriver.ClaimRequestParams) error {
	var conn int64
	if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&conn); err != nil {
		return d.wrapErr("record request "+p.ID, err)
	}
	token := uuid.New()
	_, err := tx.ExecContext(ctx, `INSERT INTO ferry_requests (id, fingerprint, attempt, created_at) VALUES (?, ?, ?, `+sqlNow+`)`,
		p.ID, p.Fingerprint, token[:])
	if errNumber(err) == errDupEntry {
		return fmt.Errorf("ferrymysql: request %s: %w", p.ID, txdriver.ErrRequestExists)
	}
	if err != nil {
		return d.wrapErr("record request "+p.ID, err)
	}
	if v, ok := attempts.Load(tx); ok {
		st := v.(*attemptState)
		st.mu.Lock()
		st.request, st.token, st.conn = p.ID, token, conn
		st.mu.Unlock()
	}
	return nil
}

// FinishRequestTx implements txdriver.Transactor.
func (d *Driver) FinishRequestTx(ctx context.Context, tx *sql.Tx, p *txdriver.FinishRequestParams) error {
	result := p.Result
	if result == nil {
		result = []byte{}
	}
	_, err := tx.ExecContext(ctx, `UPDATE ferry_requests SET result = ?, finished_at = `+sqlNow+` WHERE id = ?`, result, p.ID)
	return d.wrapErr("store the result of request "+p.ID, err)
}

// GetRequest implements txdriver.Transactor.
func (d *Driver) GetRequest(ctx context.Context, id string) (*txdriver.RequestRecord, error) {
	rec := &txdriver.RequestRecord{ID: id}
	var fp []byte
	var created int64
	err := d.db.QueryRowContext(ctx, `SELECT fingerprint, result, created_at FROM ferry_requests WHERE id = ?`, id).Scan(&fp, &rec.Result, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("ferrymysql: request %s: %w", id, ferrydriver.ErrNotFound)
	}
	if err != nil {
		return nil, d.wrapErr("read request "+id, err)
	}
	rec.Fingerprint, rec.CreatedAt = string(fp), fromMicros(created)
	return rec, nil
}

// DeleteRequests implements txdriver.Transactor: the oldest records, a
// range of ferry_requests_created_idx.
func (d *Driver) DeleteRequests(ctx context.Context, p *txdriver.DeleteRequestsParams) (int64, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	res, err := d.db.ExecContext(ctx, `DELETE FROM ferry_requests WHERE created_at < `+sqlNow+` - ? ORDER BY created_at LIMIT ?`,
		p.OlderThan.Microseconds(), limit)
	if err != nil {
		return 0, d.wrapErr("delete old request records", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

var _ txdriver.Transactor[*sql.Tx] = (*Driver)(nil)
