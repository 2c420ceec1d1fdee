package ferrymysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// A finish records its row's outcome and then checks and ends the claim
// on its key's row (with Keep, one statement: sqlFinishKept): two statements,
// record locking the row (found by the unique (group, event) index) and
// then its key (by its primary key), the order every writer of both takes.
// (One multi-table UPDATE did both, but MariaDB runs it through a
// temporary table on disk: it cost 2.4 ms of the server's CPU per finish,
// a third of the consumer's.) The second finds the claim only if it is the
// key's current one, unexpired, and covers the row's position (carried in
// the claim string: claimString); otherwise the claim was lost and the
// caller rolls both back. It does not compute the key's next head: in the
// handler's transaction (REPEATABLE READ by default) a read may be older
// than the locks taken, and would miss an event ingested since; it makes
// the key due now (for a rescue while rows after the claim are suspect),
// and the next claim reads the head afresh. Single-table assignments run
// left to right: the attempt log reads the attempts before they change,
// and the claim's columns are read before they are cleared.
// @@in_transaction fences a completion whose transaction InnoDB already
// rolled back (a deadlock that the handler did not return): it would
// otherwise commit on its own.
var sqlFinish = `
UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx)
   SET attempt_log = IF(?, ` + logAttempt("attempts + 1", "?", "?") + `, attempt_log),
       attempts = IF(?, attempts, attempts + 1),
       last_error = IF(? = 'processed', last_error, ?),
       next_attempt_at = COALESCE(?, next_attempt_at),
       finished_at = IF(? IN ('processed', 'dead'), ` + sqlNow + `, NULL),
       state = ?
 WHERE group_name = ? AND event_id = ? AND state IN ('pending', 'failed') AND @@in_transaction = 1`

// sqlFinishKept is sqlFinish for a row that processed under a claim that
// goes on (Keep: its key's row is not written), in one statement: only if
// the row's key holds the claim ? unexpired, with rows of it after the
// row. The subquery of an UPDATE reads the key's row as it is now, with a
// shared lock held to the commit (InnoDB's locking read of a subquery's
// table, which a snapshot never serves): an attempt that outlived its
// claim finds the claim gone, however old its transaction's snapshot.
var sqlFinishKept = `
UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx)
   SET attempts = attempts + 1, finished_at = ` + sqlNow + `, state = 'processed'
 WHERE group_name = ? AND event_id = ? AND state IN ('pending', 'failed') AND @@in_transaction = 1
   AND EXISTS (SELECT 1 FROM ferry_inbox_keys c FORCE INDEX (PRIMARY)
                WHERE c.group_name = ferry_inbox.group_name AND c.k = ferry_inbox.k AND c.claim_token = ?
                  AND c.claim_expires_at > ` + sqlNow + ` AND c.claim_from < ferry_inbox.pos AND c.claim_through > ferry_inbox.pos)`

// finishedKey is the key of the finished row (group ?, event ?), a plain
// read: a row's key never changes.
const finishedKey = `(SELECT i.k FROM ferry_inbox i FORCE INDEX (ferry_inbox_event_idx) WHERE i.group_name = ? AND i.event_id = ?)`

// heldClaim is the condition that the finished row's key (group ?, the
// row's group and event ?, ?) holds the claim ? unexpired, covering the
// row's position (?, ?).
const heldClaim = `group_name = ? AND k = ` + finishedKey + `
   AND claim_token = ? AND claim_expires_at > ` + sqlNow + ` AND claim_from < ? AND claim_through >= ?`

// sqlFinishKey ends the claim of a finished row's key, due now.
const sqlFinishKey = `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY) ` + endClaim + ` WHERE ` + heldClaim

// claimString is the claim of the row at pos under token: the token and
// the position, so that a finish finds the row's place in its key's claim
// without reading the row.
func claimString(token uuid.UUID, pos int64) string {
	return token.String() + ":" + strconv.FormatInt(pos, 10)
}

// parseClaim reads a claim string (claimString).
func parseClaim(claim string) (token uuid.UUID, pos int64, err error) {
	t, p, ok := strings.Cut(claim, ":")
	if !ok {
		return uuid.UUID{}, 0, fmt.Errorf("claim %q: no position", claim)
	}
	if token, err = uuid.Parse(t); err != nil {
		return uuid.UUID{}, 0, err
	}
	pos, err = strconv.ParseInt(p, 10, 64)
	return token, pos, err
}

// finish records the outcome of a claimed row inside tx; ErrClaimLost when
// the claim is not the row's key's current one.
func (d *Driver) finish(ctx context.Context, tx *sql.Tx, group string, id uuid.UUID, claim string, state ferrydriver.InboxState, lastErr string, retry any, uncounted, keep bool) error {
	lost := func() error {
		return fmt.Errorf("ferrymysql: mark event %s %s for group %s: %w", id, state, group, ferrydriver.ErrClaimLost)
	}
	token, pos, err := parseClaim(claim)
	if err != nil {
		return lost()
	}
	if keep && state == ferrydriver.InboxProcessed {
		res, err := tx.ExecContext(ctx, sqlFinishKept, group, id[:], token[:])
		if err != nil {
			return d.wrapErr("mark inbox row "+string(state), err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil
		}
		// No rows of the claim after this one (a retraction cut it), or
		// the claim is lost: the claim ends, if it holds.
	}
	logged := !uncounted && (state == ferrydriver.InboxFailed || state == ferrydriver.InboxDead)
	res, err := tx.ExecContext(ctx, sqlFinish, logged, string(state), attemptError(lastErr),
		uncounted, string(state), lastErr, retry, string(state), string(state), group, id[:])
	if err != nil {
		return d.wrapErr("mark inbox row "+string(state), err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var open bool
		if err := tx.QueryRowContext(ctx, `SELECT @@in_transaction`).Scan(&open); err == nil && !open {
			return fmt.Errorf("ferrymysql: mark event %s %s for group %s: %w", id, state, group, errTxGone)
		}
		return lost()
	}
	res, err = tx.ExecContext(ctx, sqlFinishKey, group, group, id[:], token[:], pos, pos)
	if err != nil {
		return d.wrapErr("mark inbox row "+string(state), err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return lost() // the caller rolls the row's change back
	}
	return nil
}

// CompleteInboxTx implements ferrydriver.Inbox: tx must be a transaction
// of the pool's database (the statement runs in it, and commits with the
// handler's writes).
func (d *Driver) CompleteInboxTx(ctx context.Context, tx *sql.Tx, p *ferrydriver.CompleteInboxParams) error {
	return d.finish(ctx, tx, p.Group, p.EventID, p.Claim, ferrydriver.InboxProcessed, "", nil, false, p.Keep)
}

// FailInbox implements ferrydriver.Inbox.
func (d *Driver) FailInbox(ctx context.Context, p *ferrydriver.FailInboxParams) error {
	state := ferrydriver.InboxFailed
	var retry any
	if p.Dead {
		state = ferrydriver.InboxDead
	} else {
		retry = micros(p.RetryAt)
	}
	return d.writeRC(ctx, "record a failed attempt", func(tx *sql.Tx) error {
		return d.finish(ctx, tx, p.Group, p.EventID, p.Claim, state, p.Error, retry, p.Uncounted, false)
	})
}

// RunInTx implements ferrydriver.Inbox: fn runs in a transaction of the
// pool (its default isolation, REPEATABLE READ unless the application
// chose another), which commits if fn returns nil. After a deadlock (1213)
// or a lock wait timeout (1205), in fn or at the commit, the transaction
// is rolled back and fn runs again, at most 10 times: handlers must have
// no effect outside it.
func (d *Driver) RunInTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return d.runTx(ctx, "run a transaction", nil, fn)
}

var _ ferrydriver.InboxBatcher[*sql.Tx] = (*Driver)(nil)

// Savepoint implements ferrydriver.InboxBatcher. A savepoint of the same
// name replaces the one before it (InnoDB), so a failed fn is rolled back
// to its own; the commit releases them all. A deadlock in fn rolled the
// whole transaction back (the savepoint with it): it is returned as a
// failure of the savepoint, wrapping the deadlock, so that RunInTx runs
// the transaction again.
func (d *Driver) Savepoint(ctx context.Context, tx *sql.Tx, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT ferry_event`); err != nil {
		return fmt.Errorf("ferrymysql: %w: %w", ferrydriver.ErrSavepoint, err)
	}
	err := fn(ctx, tx)
	if err == nil {
		return nil
	}
	if errNumber(err) == errDeadlock {
		return fmt.Errorf("ferrymysql: %w: the transaction was rolled back: %w", ferrydriver.ErrSavepoint, err)
	}
	if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT ferry_event`); rerr != nil {
		return fmt.Errorf("ferrymysql: %w: roll back to it after %v: %w", ferrydriver.ErrSavepoint, err, rerr)
	}
	return err
}

// FinishInboxTx implements ferrydriver.InboxBatcher: the rows are locked
// (by the unique index, in event ID order), then their keys (in key
// order), and each row checked against its key's claim; the processed
// rows are finished in one statement, each other outcome in one of its
// own, and the claims ended in a last one (a batch keeps none: the rows
// of its runs that it did not report run again, uncounted), their keys
// due now.
func (d *Driver) FinishInboxTx(ctx context.Context, tx *sql.Tx, p *ferrydriver.FinishInboxParams) ([]uuid.UUID, error) {
	if len(p.Rows) == 0 {
		return nil, nil
	}
	op := "record the outcomes of a batch of group " + p.Group
	ids := make([]uuid.UUID, len(p.Rows))
	for i, r := range p.Rows {
		ids[i] = r.EventID
	}
	current, err := lockRows(ctx, tx, p.Group, ids)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	var keys []string
	for _, r := range current {
		keys = append(keys, r.key)
	}
	claims, err := keyClaims(ctx, tx, p.Group, keys, true)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var lost, processed []uuid.UUID
	var others []ferrydriver.FinishedRow
	var tokens []any
	for _, r := range p.Rows {
		cur, ok := current[r.EventID]
		token, _, perr := parseClaim(r.Claim)
		c, held := claims[cur.key]
		if !ok || perr != nil || !held || string(c.token) != string(token[:]) || !c.covers(cur) {
			lost = append(lost, r.EventID)
			continue
		}
		if !slices.ContainsFunc(tokens, func(t any) bool { return string(t.([]byte)) == string(c.token) }) {
			tokens = append(tokens, c.token)
		}
		if r.State == ferrydriver.InboxProcessed {
			processed = append(processed, r.EventID)
		} else {
			others = append(others, r)
		}
	}
	if len(lost) > 0 {
		var open bool
		if err := tx.QueryRowContext(ctx, `SELECT @@in_transaction`).Scan(&open); err == nil && !open {
			return nil, fmt.Errorf("ferrymysql: %s: %w", op, errTxGone)
		}
		return lost, nil // the caller rolls back
	}
	if len(processed) > 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx) SET state = 'processed', attempts = attempts + 1, finished_at = `+sqlNow+`
 WHERE group_name = ? AND event_id IN (`+marks(len(processed))+`)`, idArgs([]any{p.Group}, processed)...); err != nil {
			return nil, d.wrapErr(op, err)
		}
	}
	for _, r := range others {
		var retry any
		if r.State == ferrydriver.InboxFailed {
			retry = micros(r.RetryAt)
		}
		logged := !r.Uncounted
		if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx)
   SET attempt_log = IF(?, `+logAttempt("attempts + 1", "?", "?")+`, attempt_log),
       attempts = IF(?, attempts, attempts + 1),
       last_error = ?, next_attempt_at = COALESCE(?, next_attempt_at),
       finished_at = IF(? = 'dead', `+sqlNow+`, NULL),
       state = ?
 WHERE group_name = ? AND event_id = ?`, logged, string(r.State), attemptError(r.Error), r.Uncounted, r.Error, retry,
			string(r.State), string(r.State), p.Group, r.EventID[:]); err != nil {
			return nil, d.wrapErr(op, err)
		}
	}
	err = chunks(keys, inListChunk, func(keys []string) error {
		args := []any{p.Group}
		for _, k := range keys {
			args = append(args, k)
		}
		_, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY) `+endClaim+`
 WHERE group_name = ? AND k IN (`+marks(len(keys))+`) AND claim_token IN (`+marks(len(tokens))+`)`, append(args, tokens...)...)
		return err
	})
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	return nil, nil
}

// endClaim is the SET clause that ends a key's claim after its finish:
// due now, for an ordinary claim, or for a rescue while rows after the
// claim are suspect. (Assigned left to right: the claim is read before it
// is cleared.)
const endClaim = `SET runnable_at = IF(suspect_through > claim_through, NULL, ` + sqlNow + `),
       rescue_at = IF(suspect_through > claim_through, ` + sqlNow + `, NULL), held_by = NULL, ` + noClaim
