package ferrysqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
	"github.com/google/uuid"
)

// Claims live on the key's row (migration 14), as ferrypg's: a claim takes
// a run of a key's next rows in order, with one token and one expiry, and
// stores the range of positions it covers (claim_from < pos <=
// claim_through); the rows are not written until their outcomes are
// known. A finish records its rows' outcomes and then ends the claim, or
// keeps it on the rest of the run (CompleteInboxParams.Keep). A claim that
// expired is rescued: every row it covered counts the attempt, and they
// run one at a time (suspect_through), each under a claim of its own.
//
// SQLite has one writer, and a key's queue is read through
// ferry_inbox_unfinished_idx in microseconds: after every change of a key,
// refreshKey recomputes when it may run from its rows, instead of keeping
// the bounds ferrypg keeps for its concurrent writers (done_pos, tail_pos,
// claim_dirty).

// queue reads a key's first n unfinished rows, in order, and their event
// IDs: DEAD rows count when the group's stored policy holds keys behind
// dead rows, or when none is stored.
func (d *Driver) queue(ctx context.Context, tx *sql.Tx, group, key string, n int) ([]inboxmodel.Queued, []string, error) {
	rows, err := tx.QueryContext(ctx, `
SELECT event_id, state, pos, attempts, next_attempt_at FROM ferry_inbox
 WHERE group_name = ?1 AND key = ?2 AND `+unfinished+` AND `+holdsOrNotDead+`
 ORDER BY pos LIMIT ?3`, group, key, n)
	if err != nil {
		return nil, nil, d.wrapErr("read the queue of inbox key "+key, err)
	}
	defer rows.Close()
	var out []inboxmodel.Queued
	var ids []string
	for rows.Next() {
		var q inboxmodel.Queued
		var id, state string
		var next int64
		if err := rows.Scan(&id, &state, &q.Pos, &q.Attempts, &next); err != nil {
			return nil, nil, d.wrapErr("read the queue of inbox key "+key, err)
		}
		q.State, q.RetryAt = ferrydriver.InboxState(state), time.UnixMicro(next)
		out, ids = append(out, q), append(ids, id)
	}
	return out, ids, d.wrapErr("read the queue of inbox key "+key, rows.Err())
}

// refreshKey recomputes when a key may run, from its head (its first
// unfinished row), after its queue changed. A claimed key keeps its claim:
// its finish, or the rescue of its expiry, recomputes it. Any other key is
// left as inboxmodel.NextUnclaimed says.
func (d *Driver) refreshKey(ctx context.Context, tx *sql.Tx, group, key string, t int64) error {
	var claimed bool
	var suspects int64
	err := tx.QueryRowContext(ctx, `SELECT claim_token IS NOT NULL, suspect_through FROM ferry_inbox_keys WHERE group_name = ? AND key = ?`,
		group, key).Scan(&claimed, &suspects)
	if errors.Is(err, sql.ErrNoRows) || claimed {
		return nil
	}
	if err != nil {
		return d.wrapErr("refresh inbox key "+key, err)
	}
	head, ids, err := d.queue(ctx, tx, group, key, 1)
	if err != nil {
		return err
	}
	var runnable, rescue, heldBy any
	switch at, rescueAt, held := inboxmodel.NextUnclaimed(head, suspects, time.UnixMicro(t)); {
	case held:
		heldBy = ids[0]
	case !rescueAt.IsZero():
		rescue = rescueAt.UnixMicro()
	case !at.IsZero():
		runnable = at.UnixMicro()
	}
	if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys SET runnable_at = ?, rescue_at = ?, held_by = ? WHERE group_name = ? AND key = ?`,
		runnable, rescue, heldBy, group, key); err != nil {
		return d.wrapErr("refresh inbox key "+key, err)
	}
	return nil
}

// ClaimInbox implements ferrydriver.Inbox: a claim takes runs of keys'
// rows (claimRuns); a rescue, one row of a key whose claim expired
// (rescue).
func (d *Driver) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	op := "claim inbox rows of group " + p.Group
	if p.Rescue {
		op = "rescue inbox rows of group " + p.Group
	}
	var out []*ferrydriver.InboxRow
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		var err error
		if p.Rescue {
			out, err = d.rescue(ctx, tx, p, micros(now()))
		} else {
			out, err = d.claimRuns(ctx, tx, p, micros(now()))
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// claimRuns claims, of each key whose runnable_at has come (oldest first,
// up to p.Keys and p.Limit keys), its head and, with p.PerKey, the PENDING
// rows after it (inboxmodel.RunRows), p.Limit rows in all. A head whose
// attempts are spent goes DEAD instead; a key with nothing to run now is
// recomputed.
func (d *Driver) claimRuns(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams, t int64) ([]*ferrydriver.InboxRow, error) {
	keys, err := d.keysDue(ctx, tx, sqlRunnableKeys, p.Group, t, inboxmodel.ClaimLimit(inboxmodel.ClaimParams{Limit: p.Limit, Keys: p.Keys}))
	if err != nil {
		return nil, d.wrapErr("claim inbox rows of group "+p.Group, err)
	}
	return d.claimDue(ctx, tx, p, keys, t)
}

// claimDue claims, of each of keys (due, unclaimed), its head and, with
// p.PerKey, the PENDING rows after it, p.Limit rows in all; it gives up
// heads whose attempts are spent, and recomputes keys with nothing to run.
func (d *Driver) claimDue(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams, keys []dueKey, t int64) ([]*ferrydriver.InboxRow, error) {
	var hold bool
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE((SELECT hold_dead FROM ferry_inbox_groups WHERE group_name = ?), 1)`, p.Group).Scan(&hold); err != nil {
		return nil, d.wrapErr("claim inbox rows of group "+p.Group, err)
	}
	var out []*ferrydriver.InboxRow
	token := uuid.NewString() // one per call: each key is claimed once in it
	limit := max(p.Limit, 1)
	for _, due := range keys {
		k, suspects := due.key, due.suspects
		if len(out) >= limit {
			break
		}
		n := 1
		if p.PerKey > 1 {
			n = min(p.PerKey, limit-len(out))
		}
		q, ids, err := d.queue(ctx, tx, p.Group, k, n)
		if err != nil {
			return nil, err
		}
		act, run := inboxmodel.ClaimKey(q, suspects, hold, n, time.UnixMicro(t), p.MaxAttempts)
		switch act {
		case inboxmodel.Recompute:
			// Due with nothing to run now (its rows were retracted, say):
			// put the key at its real time.
			if err := d.refreshKey(ctx, tx, p.Group, k, t); err != nil {
				return nil, err
			}
			continue
		case inboxmodel.GiveUp:
			dead, err := d.kill(ctx, tx, p.Group, k, ids[0], t)
			if err != nil {
				return nil, err
			}
			out = append(out, dead)
			continue
		}
		rows, err := d.claimKey(ctx, tx, p, k, q[0].Pos, q[run[len(run)-1]].Pos, token, t, suspects)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

// rescue claims, for each of up to p.Limit keys due for a rescue, the
// key's next row alone. A key is due when its claim expired (the process
// that held it crashed, or its handler outlived the claim: every row the
// claim covered counts an attempt, and those rows are suspect) or when it
// has suspect rows left: they run one at a time, so that the one that
// crashes its process is found and spends only its own attempts. A row
// whose attempts are spent goes DEAD instead.
func (d *Driver) rescue(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams, t int64) ([]*ferrydriver.InboxRow, error) {
	op := "rescue inbox rows of group " + p.Group
	keys, err := d.keysDue(ctx, tx, sqlRescueKeys, p.Group, t, max(p.Limit, 1))
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	var out []*ferrydriver.InboxRow
	token := uuid.NewString()
	for _, due := range keys {
		k, suspects := due.key, due.suspects
		if due.claimed {
			// Its rows count the attempt the expired claim was making.
			if _, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox SET attempts = attempts + 1
 WHERE group_name = ? AND key = ? AND pos > ? AND pos <= ? AND `+unfinished+` AND state IN ('pending', 'failed')`,
				p.Group, k, due.from, due.through); err != nil {
				return nil, d.wrapErr(op, err)
			}
			suspects = max(suspects, due.through)
		}
		q, ids, err := d.queue(ctx, tx, p.Group, k, 1)
		if err != nil {
			return nil, err
		}
		act, suspects := inboxmodel.RescueKey(q, suspects, time.UnixMicro(t), p.MaxAttempts)
		if act == inboxmodel.ClaimRows {
			rows, err := d.claimKey(ctx, tx, p, k, q[0].Pos, q[0].Pos, token, t, suspects)
			if err != nil {
				return nil, err
			}
			out = append(out, rows...)
			continue
		}
		if err := d.endClaim(ctx, tx, p.Group, k, suspects); err != nil {
			return nil, err
		}
		if act == inboxmodel.GiveUp {
			dead, err := d.kill(ctx, tx, p.Group, k, ids[0], t)
			if err != nil {
				return nil, err
			}
			out = append(out, dead)
			continue
		}
		// Nothing suspect runs now (the head waits for its retry, is
		// held, or is not suspect): the key is recomputed.
		if err := d.refreshKey(ctx, tx, p.Group, k, t); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// dueKey is a key a claim or a rescue found due, with its claim (an
// expired one, for a rescue) and how far its rows are suspect.
type dueKey struct {
	key           string
	claimed       bool
	from, through int64
	suspects      int64
}

// The keys due for an ordinary claim (none is claimed) and for a rescue,
// oldest first: group ?1, now ?2, at most ?3.
const (
	sqlRunnableKeys = `
SELECT key, FALSE, 0, 0, suspect_through FROM ferry_inbox_keys WHERE group_name = ?1 AND runnable_at <= ?2 ORDER BY runnable_at LIMIT ?3`
	sqlRescueKeys = `
SELECT key, claim_token IS NOT NULL, COALESCE(claim_from, 0), COALESCE(claim_through, 0), suspect_through
  FROM ferry_inbox_keys WHERE group_name = ?1 AND rescue_at <= ?2 ORDER BY rescue_at LIMIT ?3`
)

// keysDue reads the keys of q (sqlRunnableKeys or sqlRescueKeys).
func (d *Driver) keysDue(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]dueKey, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []dueKey
	for rows.Next() {
		var k dueKey
		if err := rows.Scan(&k.key, &k.claimed, &k.from, &k.through, &k.suspects); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// claimKey claims key's unfinished rows from position first through
// last for p.Worker under token, and returns them PROCESSING, their
// attempt counted. suspects is the key's suspect_through (a rescue's: the
// rows after last still to run alone).
func (d *Driver) claimKey(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams, key string, first, last int64, token string, t, suspects int64) ([]*ferrydriver.InboxRow, error) {
	op := "claim inbox key " + key
	expires := t + p.TTL.Microseconds()
	if _, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox_keys
   SET claim_token = ?, claimed_by = ?, claim_from = ?, claim_through = ?, claim_expires_at = ?, rescue_at = ?,
       runnable_at = NULL, held_by = NULL, suspect_through = ?
 WHERE group_name = ? AND key = ?`, token, p.Worker, first-1, last, expires, expires, suspects, p.Group, key); err != nil {
		return nil, d.wrapErr(op, err)
	}
	rows, err := tx.QueryContext(ctx, `
SELECT `+rowColumns+`, TRUE FROM ferry_inbox
 WHERE group_name = ? AND key = ? AND pos >= ? AND pos <= ? AND `+unfinished+` AND state IN ('pending', 'failed')
 ORDER BY pos`, p.Group, key, first, last)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	out, err := scanInboxRows(rows, p.Group)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	for _, r := range out {
		r.Claim = token
	}
	return out, nil
}

// kill makes key's row id DEAD, its attempts spent, and recomputes the
// key (held, or past the row, by the group's policy).
func (d *Driver) kill(ctx context.Context, tx *sql.Tx, group, key, id string, t int64) (*ferrydriver.InboxRow, error) {
	op := "give up inbox row " + id
	rows, err := tx.QueryContext(ctx, `
UPDATE ferry_inbox AS i
   SET state = 'dead', finished_at = ?1,
       last_error = ?2 || COALESCE(' (last recorded error: ' || NULLIF(last_error, '') || ')', ''),
       attempt_log = `+logAttempt("attempts", "'dead'", "?2", "?1")+`
 WHERE group_name = ?3 AND event_id = ?4
RETURNING `+rowColumns+`, FALSE`, t, ferrydriver.ReasonAttemptsExhausted, group, id)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	dead, err := scanInboxRows(rows, group)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	if len(dead) != 1 {
		return nil, fmt.Errorf("ferrysqlite: %s: the row is gone", op)
	}
	if err := d.refreshKey(ctx, tx, group, key, t); err != nil {
		return nil, err
	}
	d.events.note(settledNote{group: group, id: dead[0].Event.ID, state: ferrydriver.InboxDead})
	return dead[0], nil
}

// endClaim ends key's claim, if any, and stores how far its rows are
// suspect.
func (d *Driver) endClaim(ctx context.Context, tx *sql.Tx, group, key string, suspects int64) error {
	if _, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox_keys SET `+noClaim+`, suspect_through = ? WHERE group_name = ? AND key = ?`, suspects, group, key); err != nil {
		return d.wrapErr("end the claim of inbox key "+key, err)
	}
	return nil
}

// RescueDue implements ferrydriver.Inbox: a key's claim expired, or its
// next suspect row may run.
func (d *Driver) RescueDue(ctx context.Context, group string) (bool, error) {
	var due bool
	err := d.r.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ferry_inbox_keys WHERE group_name = ? AND rescue_at <= ?)`,
		group, micros(now())).Scan(&due)
	if err != nil {
		return false, d.wrapErr("look for expired claims in group "+group, err)
	}
	return due, nil
}

// MaxConns implements ferrydriver.Inbox: 0, as SQLite has one writer by
// design: handlers' transactions take turns on it however many workers a
// consumer runs, and a bigger pool would not change that.
func (d *Driver) MaxConns() int { return 0 }

// ClaimHolders implements ferrydriver.Inbox.
func (d *Driver) ClaimHolders(ctx context.Context, group string) ([]string, error) {
	rows, err := d.r.QueryContext(ctx, `
SELECT DISTINCT claimed_by FROM ferry_inbox_keys
 WHERE group_name = ? AND rescue_at > ? AND claim_token IS NOT NULL AND claim_expires_at > ?`, group, micros(now()), micros(now()))
	if err != nil {
		return nil, d.wrapErr("list the claim holders of group "+group, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			return nil, d.wrapErr("list the claim holders of group "+group, err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("list the claim holders of group "+group, err)
	}
	return out, nil
}

// ExpireClaims implements ferrydriver.Inbox: the claims it ends are
// expired claims, which a rescue takes (and every finish refuses).
func (d *Driver) ExpireClaims(ctx context.Context, p *ferrydriver.ExpireClaimsParams) (int, error) {
	op := "expire the claims of " + p.Worker + " in group " + p.Group
	var n int64
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		t := micros(now())
		res, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox_keys SET claim_expires_at = ?1, rescue_at = ?1
 WHERE group_name = ?2 AND rescue_at > ?1 AND claim_token IS NOT NULL AND claimed_by = ?3 AND claim_expires_at > ?1`, t, p.Group, p.Worker)
		if err != nil {
			return d.wrapErr(op, err)
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

// RunInTx implements ferrydriver.Inbox: fn runs in a transaction of DB().
func (d *Driver) RunInTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return d.write(ctx, "run a transaction", func(tx *sql.Tx) error {
		return fn(context.WithValue(ctx, holdsWriter{}, true), tx)
	})
}

// CompleteInboxTx implements ferrydriver.Inbox. tx must be a transaction
// of DB().
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
	return d.write(ctx, "record a failed attempt", func(tx *sql.Tx) error {
		return d.finish(ctx, tx, p.Group, p.EventID, p.Claim, state, p.Error, retry, p.Uncounted, false)
	})
}

// finish records a claimed row's outcome (mark) and then ends its key's
// claim, giving the rest of its run back, or, with keep, keeps the claim
// on the rest (release).
func (d *Driver) finish(ctx context.Context, tx *sql.Tx, group string, id uuid.UUID, claim string, state ferrydriver.InboxState, lastErr string, retry any, uncounted, keep bool) error {
	key, pos, err := d.mark(ctx, tx, group, id, claim, state, lastErr, retry, uncounted)
	if err != nil {
		return err
	}
	return d.release(ctx, tx, group, key, claim, pos, keep && state == ferrydriver.InboxProcessed)
}

// mark records the outcome of a claimed row, under its key's unexpired
// claim (ErrClaimLost otherwise), and, if the row finished, notes it for
// the callers awaiting it (told at commit). It returns the row's key and
// position; the caller releases the claim (release).
func (d *Driver) mark(ctx context.Context, tx *sql.Tx, group string, id uuid.UUID, claim string, state ferrydriver.InboxState, lastErr string, retry any, uncounted bool) (key string, pos int64, err error) {
	t := micros(now())
	var finishedAt any
	if state == ferrydriver.InboxProcessed || state == ferrydriver.InboxDead {
		finishedAt = t
	}
	err = tx.QueryRowContext(ctx, `
UPDATE ferry_inbox AS i
   SET state = ?1,
       attempts = attempts + NOT ?9,
       last_error = CASE WHEN ?1 = 'processed' THEN last_error ELSE ?2 END,
       attempt_log = CASE WHEN NOT ?9 AND ?1 IN ('failed', 'dead') THEN `+logAttempt("attempts + 1", "?1", "?2", "?8")+` ELSE attempt_log END,
       next_attempt_at = COALESCE(?3, next_attempt_at), finished_at = ?4
 WHERE group_name = ?5 AND event_id = ?6 AND state IN ('pending', 'failed')
   AND EXISTS (SELECT 1 FROM ferry_inbox_keys c
                WHERE c.group_name = ?5 AND c.key = i.key AND c.claim_token = ?7 AND c.claim_expires_at > ?8
                  AND i.pos > c.claim_from AND i.pos <= c.claim_through)
RETURNING key, pos`, string(state), lastErr, retry, finishedAt, group, id.String(), claim, t, uncounted).Scan(&key, &pos)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, fmt.Errorf("ferrysqlite: mark event %s %s for group %s: %w", id, state, group, ferrydriver.ErrClaimLost)
	}
	if err != nil {
		return "", 0, d.wrapErr("mark inbox row "+string(state), err)
	}
	if state.Finished() {
		d.events.note(settledNote{group: group, id: id, state: state})
	}
	return key, pos, nil
}

// release follows the outcomes of key's rows up to pos under claim: with
// keep, the claim goes on over the rest of its run, if any is left;
// otherwise it ends, and the rows it covered that were not reported run
// again under a later claim, uncounted. The key is then recomputed.
func (d *Driver) release(ctx context.Context, tx *sql.Tx, group, key, claim string, pos int64, keep bool) error {
	op := "release the claim of inbox key " + key
	if keep {
		res, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox_keys SET claim_from = ?1
 WHERE group_name = ?2 AND key = ?3 AND claim_token = ?4 AND EXISTS (
       SELECT 1 FROM ferry_inbox i WHERE i.group_name = ?2 AND i.key = ?3 AND i.pos > ?1 AND i.pos <= claim_through
          AND i.`+unfinished+` AND i.state IN ('pending', 'failed'))`, pos, group, key, claim)
		if err != nil {
			return d.wrapErr(op, err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys SET `+noClaim+` WHERE group_name = ? AND key = ? AND claim_token = ?`,
		group, key, claim); err != nil {
		return d.wrapErr(op, err)
	}
	return d.refreshKey(ctx, tx, group, key, micros(now()))
}
