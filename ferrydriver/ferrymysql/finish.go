package ferrymysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// A finish changes its row only if the claim presented is the row's
// current one and has not expired (its token, PROCESSING, the expiry after
// the server's now), found by the unique (group, event) index, then makes
// the row's key due now by the key's primary key: two single-table
// UPDATEs, record locking the row and then its key, the order every
// writer of both takes. (One multi-table UPDATE did both, but MariaDB runs
// it through a temporary table on disk: it cost 2.4 ms of the server's CPU
// per finish, a third of the consumer's.) It does not compute the key's
// next head: in the handler's transaction (REPEATABLE READ by default) a
// read may be older than the locks taken, and would miss an event ingested
// since; the next claim reads the head afresh. Single-table assignments
// run left to right: the attempt log reads the attempts before they
// change. @@in_transaction fences a completion whose transaction InnoDB
// already rolled back (a deadlock that the handler did not return): it
// would otherwise commit on its own.
var sqlFinish = `
UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx)
   SET attempt_log = IF(?, ` + logAttempt("attempts", "?", "?") + `, attempt_log),
       attempts = IF(?, GREATEST(attempts - 1, 0), attempts),
       last_error = IF(? = 'processed', last_error, ?),
       next_attempt_at = COALESCE(?, next_attempt_at),
       finished_at = IF(? IN ('processed', 'dead'), ` + sqlNow + `, NULL),
       state = ?, claimed_by = NULL, claim_token = NULL, claim_expires_at = NULL
 WHERE group_name = ? AND event_id = ? AND claim_token = ? AND state = 'processing' AND claim_expires_at > ` + sqlNow + `
   AND @@in_transaction = 1`

// sqlFinishKey makes a finished row's key due now (the row's key never
// changes, so a plain read of it is current).
const sqlFinishKey = `
UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY) SET runnable_at = ` + sqlNow + `, held_by = NULL
 WHERE group_name = ? AND k = (SELECT i.k FROM ferry_inbox i FORCE INDEX (ferry_inbox_event_idx) WHERE i.group_name = ? AND i.event_id = ?)`

// finish records the outcome of a claimed row inside tx; ErrClaimLost when
// the claim is not the row's current one.
func (d *Driver) finish(ctx context.Context, tx *sql.Tx, group string, id uuid.UUID, claim string, state ferrydriver.InboxState, lastErr string, retry any, uncounted, keep bool) error {
	token, more, err := parseClaim(claim)
	if err != nil {
		return fmt.Errorf("ferrymysql: mark event %s %s for group %s: %w", id, state, group, ferrydriver.ErrClaimLost)
	}
	logged := !uncounted && (state == ferrydriver.InboxFailed || state == ferrydriver.InboxDead)
	res, err := tx.ExecContext(ctx, sqlFinish, logged, string(state), attemptError(lastErr),
		uncounted, string(state), lastErr, retry, string(state), string(state), group, id[:], token[:])
	if err != nil {
		return d.wrapErr("mark inbox row "+string(state), err)
	}
	if n, _ := res.RowsAffected(); n > 0 {
		// The row's run (runs.go): with Keep, its later rows stay claimed,
		// and the key with them; otherwise they are given back.
		if more {
			if keep && state == ferrydriver.InboxProcessed {
				return nil
			}
			if err := giveBack(ctx, tx, sqlRunRest, group, group, id[:], token[:]); err != nil {
				return d.wrapErr("give back the rest of a run", err)
			}
		}
		if _, err := tx.ExecContext(ctx, sqlFinishKey, group, group, id[:]); err != nil {
			return d.wrapErr("mark inbox row "+string(state), err)
		}
		return nil
	}
	var open bool
	if err := tx.QueryRowContext(ctx, `SELECT @@in_transaction`).Scan(&open); err == nil && !open {
		return fmt.Errorf("ferrymysql: mark event %s %s for group %s: %w", id, state, group, errTxGone)
	}
	return fmt.Errorf("ferrymysql: mark event %s %s for group %s: %w", id, state, group, ferrydriver.ErrClaimLost)
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
// (by the unique index, in event ID order) and checked against their
// claims in one statement, the processed ones finished in one more, each
// other outcome in one of its own, and their keys made due in a last one,
// locked in key order.
func (d *Driver) FinishInboxTx(ctx context.Context, tx *sql.Tx, p *ferrydriver.FinishInboxParams) ([]uuid.UUID, error) {
	if len(p.Rows) == 0 {
		return nil, nil
	}
	op := "record the outcomes of a batch of group " + p.Group
	ids := make([]uuid.UUID, len(p.Rows))
	for i, r := range p.Rows {
		ids[i] = r.EventID
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return strings.Compare(string(a[:]), string(b[:])) })
	type held struct {
		token []byte
		key   string
	}
	current := map[uuid.UUID]held{}
	err := chunks(ids, inListChunk, func(ids []uuid.UUID) error {
		rows, err := tx.QueryContext(ctx, `SELECT event_id, claim_token, k FROM ferry_inbox FORCE INDEX (ferry_inbox_event_idx)
 WHERE group_name = ? AND event_id IN (`+marks(len(ids))+`) AND state = 'processing' AND claim_expires_at > `+sqlNow+` AND @@in_transaction = 1
 ORDER BY event_id FOR UPDATE`, idArgs([]any{p.Group}, ids)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, token, k []byte
			if err := rows.Scan(&id, &token, &k); err != nil {
				return err
			}
			u, err := uuid.FromBytes(id)
			if err != nil {
				return err
			}
			current[u] = held{token: token, key: string(k)}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	var lost, processed []uuid.UUID
	var others []ferrydriver.FinishedRow
	var keys []string
	// The keys and tokens of the rows with later rows in their run.
	var runKeys []string
	var runTokens []any
	for _, r := range p.Rows {
		h, ok := current[r.EventID]
		token, more, perr := parseClaim(r.Claim)
		if !ok || perr != nil || string(h.token) != string(token[:]) {
			lost = append(lost, r.EventID)
			continue
		}
		keys = append(keys, h.key)
		if more {
			runKeys = append(runKeys, h.key)
			if !slices.ContainsFunc(runTokens, func(t any) bool { return string(t.([]byte)) == string(h.token) }) {
				runTokens = append(runTokens, h.token)
			}
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
		if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx) SET state = 'processed', claimed_by = NULL, claim_token = NULL, claim_expires_at = NULL, finished_at = `+sqlNow+`
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
   SET attempt_log = IF(?, `+logAttempt("attempts", "?", "?")+`, attempt_log),
       attempts = IF(?, GREATEST(attempts - 1, 0), attempts),
       last_error = ?, next_attempt_at = COALESCE(?, next_attempt_at),
       finished_at = IF(? = 'dead', `+sqlNow+`, NULL),
       state = ?, claimed_by = NULL, claim_token = NULL, claim_expires_at = NULL
 WHERE group_name = ? AND event_id = ?`, logged, string(r.State), attemptError(r.Error), r.Uncounted, r.Error, retry,
			string(r.State), string(r.State), p.Group, r.EventID[:]); err != nil {
			return nil, d.wrapErr(op, err)
		}
	}
	// The rows of the runs of the reported rows that had later rows in
	// theirs, not reported themselves, are given back (current holds every
	// reported row: none was lost).
	if len(runTokens) > 0 {
		slices.Sort(runKeys)
		runKeys = slices.Compact(runKeys)
		err = chunks(runKeys, inListChunk, func(keys []string) error {
			args := []any{p.Group}
			for _, k := range keys {
				args = append(args, k)
			}
			return giveBack(ctx, tx, runsRest(len(keys), len(runTokens)), append(args, runTokens...)...)
		})
		if err != nil {
			return nil, d.wrapErr(op, err)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	err = chunks(keys, inListChunk, func(keys []string) error {
		args := []any{p.Group}
		for _, k := range keys {
			args = append(args, k)
		}
		_, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY) SET runnable_at = `+sqlNow+`, held_by = NULL WHERE group_name = ? AND k IN (`+marks(len(keys))+`)`, args...)
		return err
	})
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	return nil, nil
}
