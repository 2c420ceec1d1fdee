package ferrysqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

// The inbox follows the same model as ferrypg's: one row per (group,
// event), one ferry_inbox_keys row per (group, key) saying when the key's
// head may run. SQLite has one writer at a time, so every change below runs
// in a write transaction and needs no row locks.

const unfinished = `state IN ('pending', 'processing', 'failed', 'dead')`

// holdsOrNotDead passes a row of group ?1 unless it is DEAD and the group's
// policy (Hold when none is stored) lets the key's later rows run.
const holdsOrNotDead = `(state <> 'dead' OR COALESCE((SELECT hold_dead FROM ferry_inbox_groups WHERE group_name = ?1), 1))`

// settleFallback is how often AwaitSettled reads the states again when no
// commit of this process woke it: consumers in another process sharing the
// database file finish events without telling this one.
const settleFallback = time.Second

const inboxRowColumns = `event_id, key, seq, topic, type, source, content_type, headers, payload, created_at,
       state, attempts, COALESCE(last_error, ''), next_attempt_at, received_at, finished_at`

func scanInboxRows(rows *sql.Rows, group string) ([]*ferrydriver.InboxRow, error) {
	defer rows.Close()
	var out []*ferrydriver.InboxRow
	for rows.Next() {
		row := &ferrydriver.InboxRow{Group: group}
		ev := &row.Event
		var id, state string
		var headers sql.NullString
		var created, next, received int64
		var finished sql.NullInt64
		if err := rows.Scan(&id, &ev.Key, &ev.Seq, &ev.Topic, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created,
			&state, &row.Attempts, &row.LastError, &next, &received, &finished); err != nil {
			return nil, err
		}
		if err := ev.ID.UnmarshalText([]byte(id)); err != nil {
			return nil, fmt.Errorf("inbox row with event id %q: %w", id, err)
		}
		if err := decodeHeaders(ev, headers); err != nil {
			return nil, err
		}
		row.State = ferrydriver.InboxState(state)
		ev.CreatedAt, row.NextAttemptAt, row.ReceivedAt = fromMicros(created), fromMicros(next), fromMicros(received)
		if finished.Valid {
			row.FinishedAt = fromMicros(finished.Int64)
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// InsertInbox implements ferrydriver.Inbox.
func (d *Driver) InsertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams) ([]bool, error) {
	res := make([]bool, len(p.Events))
	if len(p.Events) == 0 {
		return res, nil
	}
	op := "insert into inbox of group " + p.Group
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		return d.insertInboxTx(ctx, tx, p.Group, p.Events, res, micros(now()))
	})
	if err != nil {
		clear(res)
		return nil, err
	}
	return res, nil
}

// insertInboxTx records events for group inside tx, setting inserted[i]
// for each new one, and makes the keys that had nothing to do runnable.
func (d *Driver) insertInboxTx(ctx context.Context, tx *sql.Tx, group string, events []*ferryevent.Event, inserted []bool, t int64) error {
	op := "insert into inbox of group " + group
	ins, err := tx.PrepareContext(ctx, `
INSERT INTO ferry_inbox (group_name, event_id, key, seq, topic, type, source, content_type, headers, payload, created_at, next_attempt_at, received_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (group_name, event_id) DO NOTHING`)
	if err != nil {
		return d.wrapErr(op, err)
	}
	defer ins.Close()
	var keys []string
	for i, ev := range events {
		c, err := encodeEvent(ev)
		if err != nil {
			return err
		}
		r, err := ins.ExecContext(ctx, group, c.id, ev.Key, ev.Seq, ev.Topic, ev.Type, ev.Source, ev.ContentType, c.headers, c.payload, micros(ev.CreatedAt), t, t)
		if err != nil {
			return d.wrapErr(op, err)
		}
		if n, _ := r.RowsAffected(); n == 1 {
			inserted[i] = true
			keys = append(keys, ev.Key)
		}
	}
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		// A key with nothing to do becomes runnable; one that waits (a
		// retry, a running row, a dead head) keeps its time.
		if _, err := tx.ExecContext(ctx, `
INSERT INTO ferry_inbox_keys (group_name, key, runnable_at) VALUES (?, ?, ?)
ON CONFLICT (group_name, key) DO UPDATE SET runnable_at = excluded.runnable_at
 WHERE runnable_at IS NULL AND held_by IS NULL`, group, k, t); err != nil {
			return d.wrapErr(op, err)
		}
	}
	return nil
}

// head is a key's oldest unfinished row.
type head struct {
	id, state    string
	pos          int64
	attempts     int
	nextAttempt  int64
	claimExpires sql.NullInt64
	busyUntil    sql.NullInt64 // another row of the key runs until then
	// stale: another row of the key is PROCESSING under a claim that
	// expired (a row redriven ahead of it is the head): the key waits for
	// a rescue, which takes the head.
	stale  bool
	hold   bool // the group's dead policy, as the head was read under it
	exists bool
}

// view is the head as inboxmodel.Decide reads it.
func (h *head) view() inboxmodel.KeyHead {
	if !h.exists {
		return inboxmodel.KeyHead{}
	}
	v := inboxmodel.KeyHead{State: ferrydriver.InboxState(h.state), RetryAt: time.UnixMicro(h.nextAttempt), Stale: h.stale}
	if h.claimExpires.Valid {
		v.ClaimExpires = time.UnixMicro(h.claimExpires.Int64)
	}
	if h.busyUntil.Valid {
		v.BusyUntil = time.UnixMicro(h.busyUntil.Int64)
	}
	return v
}

// keyHead reads a key's head (a DEAD row counts when the group's stored
// policy holds keys behind dead rows, or when none is stored) and whether
// another of its rows is running, as of t.
func (d *Driver) keyHead(ctx context.Context, tx *sql.Tx, group, key string, t int64) (*head, error) {
	h := &head{}
	// One statement: a key without a head has no row running either (a
	// running row is unfinished, so it would be the head).
	err := tx.QueryRowContext(ctx, `
SELECT h.event_id, h.state, h.pos, h.attempts, h.next_attempt_at, h.claim_expires_at,
       (SELECT max(p.claim_expires_at) FROM ferry_inbox p
         WHERE p.group_name = ?1 AND p.key = ?2 AND p.state = 'processing' AND p.claim_expires_at > ?3 AND p.event_id <> h.event_id),
       EXISTS (SELECT 1 FROM ferry_inbox p
         WHERE p.group_name = ?1 AND p.key = ?2 AND p.state = 'processing' AND p.claim_expires_at <= ?3 AND p.event_id <> h.event_id),
       COALESCE((SELECT hold_dead FROM ferry_inbox_groups WHERE group_name = ?1), 1)
  FROM (SELECT event_id, state, pos, attempts, next_attempt_at, claim_expires_at FROM ferry_inbox
         WHERE group_name = ?1 AND key = ?2 AND `+unfinished+` AND `+holdsOrNotDead+`
         ORDER BY pos LIMIT 1) h`, group, key, t).Scan(&h.id, &h.state, &h.pos, &h.attempts, &h.nextAttempt, &h.claimExpires, &h.busyUntil, &h.stale, &h.hold)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return nil, d.wrapErr("read the head of inbox key "+key, err)
	default:
		h.exists = true
	}
	return h, nil
}

// refreshKey recomputes when a key's head may run (inboxmodel.Schedule),
// after its head changed.
func (d *Driver) refreshKey(ctx context.Context, tx *sql.Tx, group, key string, t int64) error {
	h, err := d.keyHead(ctx, tx, group, key, t)
	if err != nil {
		return err
	}
	var runnable, heldBy any
	switch at, held := inboxmodel.Schedule(h.view(), time.UnixMicro(t)); {
	case held:
		heldBy = h.id
	case !at.IsZero():
		runnable = at.UnixMicro()
	}
	if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys SET runnable_at = ?, held_by = ? WHERE group_name = ? AND key = ?`,
		runnable, heldBy, group, key); err != nil {
		return d.wrapErr("refresh inbox key "+key, err)
	}
	return nil
}

// ClaimInbox implements ferrydriver.Inbox.
func (d *Driver) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	op := "claim inbox rows of group " + p.Group
	var out []*ferrydriver.InboxRow
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		out = nil
		t := micros(now())
		q := `
SELECT key FROM ferry_inbox_keys WHERE group_name = ? AND runnable_at IS NOT NULL AND runnable_at <= ?
 ORDER BY runnable_at LIMIT ?`
		if p.Rescue {
			// A run's rows share the claim's expiry: a key once.
			q = `
SELECT key FROM ferry_inbox WHERE group_name = ? AND state = 'processing' AND claim_expires_at <= ?
 GROUP BY key ORDER BY min(claim_expires_at) LIMIT ?`
		}
		rows, err := tx.QueryContext(ctx, q, p.Group, t, claimLimit(p))
		if err != nil {
			return d.wrapErr(op, err)
		}
		var keys []string
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return d.wrapErr(op, err)
			}
			keys = append(keys, k)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return d.wrapErr(op, err)
		}
		expires := t + p.TTL.Microseconds()
		token := uuid.NewString() // one per call: each row is claimed once in it
		limit := max(p.Limit, 1)
		for _, k := range keys {
			if len(out) >= limit {
				break
			}
			h, err := d.keyHead(ctx, tx, p.Group, k, t)
			if err != nil {
				return err
			}
			switch inboxmodel.Decide(h.view(), time.UnixMicro(t), p.Rescue) {
			case inboxmodel.Wait:
				// Due but nothing to run now: put the key at its real time.
				if err := d.refreshKey(ctx, tx, p.Group, k, t); err != nil {
					return err
				}
				continue
			case inboxmodel.LeaveToRescue:
				// Left to ClaimInbox with Rescue; to the back for a second,
				// so that it cannot crowd out the others.
				if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys SET runnable_at = ? WHERE group_name = ? AND key = ?`,
					t+time.Second.Microseconds(), p.Group, k); err != nil {
					return d.wrapErr(op, err)
				}
				continue
			case inboxmodel.LeaveToClaim:
				continue
			}
			if p.MaxAttempts > 0 && h.attempts >= p.MaxAttempts {
				// Its last attempts lost their claims: give it up.
				rows, err := tx.QueryContext(ctx, `
UPDATE ferry_inbox
   SET state = 'dead', claimed_by = NULL, claim_expires_at = NULL, claim_token = NULL, finished_at = ?1,
       last_error = ?2 || COALESCE(' (last recorded error: ' || NULLIF(last_error, '') || ')', ''),
       attempt_log = `+logAttempt("attempts", "'dead'", "?2", "?1")+`
 WHERE group_name = ?3 AND event_id = ?4 RETURNING `+inboxRowColumns, t, ferrydriver.ReasonAttemptsExhausted, p.Group, h.id)
				if err != nil {
					return d.wrapErr(op, err)
				}
				dead, err := scanInboxRows(rows, p.Group)
				if err != nil {
					return d.wrapErr(op, err)
				}
				if err := d.refreshKey(ctx, tx, p.Group, k, t); err != nil {
					return err
				}
				for _, r := range dead {
					d.events.note(settledNote{group: p.Group, id: r.Event.ID, state: ferrydriver.InboxDead})
				}
				out = append(out, dead...)
				continue
			}
			run := []string{h.id}
			if h.state == string(ferrydriver.InboxPending) && !p.Rescue && p.PerKey > 1 {
				more, err := d.runAfter(ctx, tx, p.Group, k, h, min(p.PerKey, limit-len(out))-1)
				if err != nil {
					return err
				}
				run = append(run, more...)
			}
			for _, id := range run {
				rows, err := tx.QueryContext(ctx, `
UPDATE ferry_inbox SET state = 'processing', attempts = attempts + 1, claimed_by = ?, claim_token = ?, claim_expires_at = ?
 WHERE group_name = ? AND event_id = ? RETURNING `+inboxRowColumns, p.Worker, token, expires, p.Group, id)
				if err != nil {
					return d.wrapErr(op, err)
				}
				claimed, err := scanInboxRows(rows, p.Group)
				if err != nil {
					return d.wrapErr(op, err)
				}
				for _, r := range claimed {
					r.Claim = token
				}
				out = append(out, claimed...)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys SET runnable_at = ? WHERE group_name = ? AND key = ?`,
				expires, p.Group, k); err != nil {
				return d.wrapErr(op, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// runAfter returns the rows a run takes after its PENDING head h, at most
// n (inboxmodel.RunRows): the key's next PENDING rows, in order, passing
// DEAD rows the group's policy lets the key pass (the statement leaves
// them out, so that they do not count toward its LIMIT) and stopping at
// any other row that cannot run now.
func (d *Driver) runAfter(ctx context.Context, tx *sql.Tx, group, key string, h *head, n int) ([]string, error) {
	if n <= 0 {
		return nil, nil
	}
	rows, err := tx.QueryContext(ctx, `
SELECT event_id, state FROM ferry_inbox
 WHERE group_name = ?1 AND key = ?2 AND pos > ?3 AND `+unfinished+` AND `+holdsOrNotDead+`
 ORDER BY pos LIMIT ?4`, group, key, h.pos, n)
	if err != nil {
		return nil, d.wrapErr("read the run of inbox key "+key, err)
	}
	defer rows.Close()
	var ids []string
	var states []ferrydriver.InboxState
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			return nil, d.wrapErr("read the run of inbox key "+key, err)
		}
		ids, states = append(ids, id), append(states, ferrydriver.InboxState(state))
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("read the run of inbox key "+key, err)
	}
	var out []string
	for _, i := range inboxmodel.RunRows(states, h.hold, n) {
		out = append(out, ids[i])
	}
	return out, nil
}

// RescueDue implements ferrydriver.Inbox: a rescue would take a key's
// head (inboxmodel.Decide): a key with a row under an expired claim and
// none under a live one, whose head runs now (PENDING, FAILED and due, or
// the expired claim's own row). A head that a rescue took and that failed
// (its retry later, or DEAD holding the key) leaves the rest of its run
// under the expired claim, and no rescue due until it may run again.
func (d *Driver) RescueDue(ctx context.Context, group string) (bool, error) {
	var due bool
	err := d.r.QueryRowContext(ctx, `
WITH k AS (
    SELECT DISTINCT key FROM ferry_inbox WHERE group_name = ?1 AND state = 'processing' AND claim_expires_at <= ?2
), h AS (
    SELECT k.key, (SELECT pos FROM ferry_inbox WHERE group_name = ?1 AND key = k.key AND `+unfinished+` AND `+holdsOrNotDead+`
                    ORDER BY pos LIMIT 1) AS pos
      FROM k
     WHERE NOT EXISTS (SELECT 1 FROM ferry_inbox q
                        WHERE q.group_name = ?1 AND q.key = k.key AND q.state = 'processing' AND q.claim_expires_at > ?2)
)
SELECT EXISTS (SELECT 1 FROM h JOIN ferry_inbox i ON i.pos = h.pos
                WHERE i.state = 'pending' OR (i.state = 'failed' AND i.next_attempt_at <= ?2)
                   OR (i.state = 'processing' AND i.claim_expires_at <= ?2))`,
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
SELECT DISTINCT claimed_by FROM ferry_inbox
 WHERE group_name = ? AND state = 'processing' AND claim_expires_at > ? AND claimed_by IS NOT NULL`, group, micros(now()))
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

// ExpireClaims implements ferrydriver.Inbox: the rows it ends are
// expired claims, which a rescue takes (and every finish refuses).
func (d *Driver) ExpireClaims(ctx context.Context, p *ferrydriver.ExpireClaimsParams) (int, error) {
	group, worker := p.Group, p.Worker
	op := "expire the claims of " + worker + " in group " + group
	var n int64
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		t := micros(now())
		res, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox SET claim_expires_at = ?
 WHERE group_name = ? AND state = 'processing' AND claimed_by = ? AND claim_expires_at > ?`, t, group, worker, t)
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

// finish moves a claimed row to state (mark), gives the rest of its run
// back unless keep (giveBack) and recomputes its key's head.
func (d *Driver) finish(ctx context.Context, tx *sql.Tx, group string, id uuid.UUID, claim string, state ferrydriver.InboxState, lastErr string, retry any, uncounted, keep bool) error {
	key, pos, err := d.mark(ctx, tx, group, id, claim, state, lastErr, retry, uncounted)
	if err != nil {
		return err
	}
	if !keep {
		if err := d.giveBack(ctx, tx, group, key, pos, claim); err != nil {
			return err
		}
	}
	return d.refreshKey(ctx, tx, group, key, micros(now()))
}

// mark moves a claimed row to state, under its unexpired claim
// (ErrClaimLost otherwise), and, if the row finished, notes it for the
// callers awaiting it (told at commit). It returns the row's key and
// position; the caller recomputes the key's head.
func (d *Driver) mark(ctx context.Context, tx *sql.Tx, group string, id uuid.UUID, claim string, state ferrydriver.InboxState, lastErr string, retry any, uncounted bool) (key string, pos int64, err error) {
	t := micros(now())
	var finishedAt any
	if state == ferrydriver.InboxProcessed || state == ferrydriver.InboxDead {
		finishedAt = t
	}
	err = tx.QueryRowContext(ctx, `
UPDATE ferry_inbox
   SET state = ?1, claimed_by = NULL, claim_expires_at = NULL, claim_token = NULL,
       attempts = CASE WHEN ?9 THEN max(attempts - 1, 0) ELSE attempts END,
       last_error = CASE WHEN ?1 = 'processed' THEN last_error ELSE ?2 END,
       attempt_log = CASE WHEN NOT ?9 AND ?1 IN ('failed', 'dead') THEN `+logAttempt("attempts", "?1", "?2", "?8")+` ELSE attempt_log END,
       next_attempt_at = COALESCE(?3, next_attempt_at), finished_at = ?4
 WHERE group_name = ?5 AND event_id = ?6 AND claim_token = ?7 AND state = 'processing' AND claim_expires_at > ?8
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

// giveBack makes the rows of key after pos that are PROCESSING under
// claim PENDING again, their attempt taken back: the rest of a run whose
// finish ended it (a failure, or a completion without Keep). They run
// again under a later claim, uncounted.
func (d *Driver) giveBack(ctx context.Context, tx *sql.Tx, group, key string, pos int64, claim string) error {
	if _, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox SET state = 'pending', attempts = max(attempts - 1, 0), claimed_by = NULL, claim_token = NULL, claim_expires_at = NULL
 WHERE group_name = ? AND key = ? AND pos > ? AND state = 'processing' AND claim_token = ?`, group, key, pos, claim); err != nil {
		return d.wrapErr("give back the rest of a run of inbox key "+key, err)
	}
	return nil
}

// inListChunk bounds the values of one IN list: a statement over more
// events runs once per chunk.
const inListChunk = 500

// placeholders returns "?, ?, ..." for n values.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// InboxStates implements ferrydriver.Settler.
func (d *Driver) InboxStates(ctx context.Context, p *ferrydriver.InboxIDsParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	out := make(map[uuid.UUID]*ferrydriver.InboxRow, len(p.EventIDs))
	for start := 0; start < len(p.EventIDs); start += inListChunk {
		chunk := p.EventIDs[start:min(start+inListChunk, len(p.EventIDs))]
		args := []any{p.Group}
		for _, id := range chunk {
			args = append(args, id.String())
		}
		rows, err := d.r.QueryContext(ctx, `SELECT `+inboxRowColumns+` FROM ferry_inbox WHERE group_name = ? AND event_id IN (`+placeholders(len(chunk))+`)`, args...)
		if err != nil {
			return nil, d.wrapErr("read inbox states of group "+p.Group, err)
		}
		got, err := scanInboxRows(rows, p.Group)
		if err != nil {
			return nil, d.wrapErr("read inbox states of group "+p.Group, err)
		}
		for _, row := range got {
			out[row.Event.ID] = row
		}
	}
	return out, nil
}

// AwaitSettled implements ferrydriver.Settler. It subscribes to this
// driver's commits, reads the events' states once, and then waits: a
// commit through this driver that finishes one of the events wakes it at
// once. Events finished by another process sharing the file are seen
// within a second (SQLite cannot tell another process of a commit).
func (d *Driver) AwaitSettled(ctx context.Context, p *ferrydriver.AwaitSettledParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	sub, unsubscribe := d.events.subscribe(p.Group, p.EventIDs)
	defer unsubscribe()
	ids := &ferrydriver.InboxIDsParams{Group: p.Group, EventIDs: p.EventIDs}
	states, err := d.InboxStates(ctx, ids)
	if err != nil {
		return nil, err
	}
	pending := map[uuid.UUID]bool{}
	update := func(fresh map[uuid.UUID]*ferrydriver.InboxRow) {
		for id := range pending {
			if row, ok := fresh[id]; ok {
				states[id] = row
				if row.State.Finished() {
					delete(pending, id)
				}
			}
		}
	}
	for _, id := range p.EventIDs {
		pending[id] = true
	}
	update(states)
	timer := time.NewTimer(time.Until(p.Deadline))
	defer timer.Stop()
	fallback := time.NewTicker(settleFallback)
	defer fallback.Stop()
	for len(pending) > 0 {
		var reread []uuid.UUID
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			return states, nil // the deadline: what is left is pending
		case n := <-sub.notes:
			if !pending[n.id] {
				continue
			}
			if n.state == ferrydriver.InboxProcessed && states[n.id] != nil {
				states[n.id].State = n.state
				delete(pending, n.id)
				continue
			}
			reread = []uuid.UUID{n.id} // read it for the reason
		case <-sub.dirty:
			reread = p.EventIDs
		case <-fallback.C:
			for id := range pending {
				reread = append(reread, id)
			}
		}
		fresh, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: p.Group, EventIDs: reread})
		if err != nil {
			return nil, err
		}
		update(fresh)
	}
	return states, nil
}

var _ ferrydriver.Inbox[*sql.Tx] = (*Driver)(nil)

// claimLimit is how many keys a claim takes: as many as both Limit and
// Keys allow (Limit bounds the rows too: a key's run counts its rows).
func claimLimit(p *ferrydriver.ClaimInboxParams) int {
	n := max(p.Limit, 1)
	if p.Keys > 0 {
		n = min(n, p.Keys)
	}
	return n
}
