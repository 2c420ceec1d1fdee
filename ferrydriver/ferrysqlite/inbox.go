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
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

// The inbox follows the same model as ferrypg's: one row per (group,
// event), one ferry_inbox_keys row per (group, key) saying when the key's
// head may run and holding its claim (claim.go). SQLite has one writer at a
// time, so every change below runs in a write transaction and needs no row
// locks.

const unfinished = `state IN ('pending', 'processing', 'failed', 'dead')`

// holdsOrNotDead passes a row of group ?1 unless it is DEAD and the group's
// policy (Hold when none is stored) lets the key's later rows run.
const holdsOrNotDead = `(state <> 'dead' OR COALESCE((SELECT hold_dead FROM ferry_inbox_groups WHERE group_name = ?1), 1))`

// settleFallback is how often AwaitSettled reads the states again when no
// commit of this process woke it: consumers in another process sharing the
// database file finish events without telling this one.
const settleFallback = time.Second

// inboxRowColumns are the columns scanInboxRows reads, of an inbox row i,
// the last saying whether the row is inside its key's claim (inClaim).
const inboxRowColumns = rowColumns + `, ` + inClaim

// rowColumns are inboxRowColumns but the last, for a statement that knows
// whether its rows are claimed (and for RETURNING, which takes no alias).
const rowColumns = `event_id, key, seq, topic, type, source, content_type, headers, payload, created_at,
       state, attempts, COALESCE(last_error, ''), next_attempt_at, received_at, finished_at`

// noClaim is the SET of a key whose claim ends.
const noClaim = `claim_token = NULL, claimed_by = NULL, claim_from = NULL, claim_through = NULL, claim_expires_at = NULL, rescue_at = NULL`

// inClaim says whether inbox row i is inside its key's claim (one that
// expired included: its rows are PROCESSING until a rescue takes them).
// Only a PENDING or FAILED row can be: such a row reads as PROCESSING, its
// attempt counted (the finish stores it).
const inClaim = `(i.state IN ('pending', 'failed') AND EXISTS (
        SELECT 1 FROM ferry_inbox_keys c
         WHERE c.group_name = i.group_name AND c.key = i.key AND c.claim_token IS NOT NULL
           AND i.pos > c.claim_from AND i.pos <= c.claim_through))`

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
		var claimed bool
		if err := rows.Scan(&id, &ev.Key, &ev.Seq, &ev.Topic, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created,
			&state, &row.Attempts, &row.LastError, &next, &received, &finished, &claimed); err != nil {
			return nil, err
		}
		if claimed {
			state, row.Attempts = string(ferrydriver.InboxProcessing), row.Attempts+1
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
	res, _, err := d.insertInbox(ctx, p, nil)
	return res, err
}

var _ ferrydriver.InboxIngestClaimer = (*Driver)(nil)

// InsertInboxClaim implements ferrydriver.InboxIngestClaimer: InsertInbox
// whose transaction also claims, as claimRuns would, the new rows of up to
// c.Keys of the keys it found idle, in key order (SQLite has one writer:
// nothing changes a key between its insert and its claim).
func (d *Driver) InsertInboxClaim(ctx context.Context, p *ferrydriver.InsertInboxParams, c *ferrydriver.IngestClaimParams) ([]bool, []*ferrydriver.InboxRow, error) {
	return d.insertInbox(ctx, p, c)
}

// insertInbox records p's events and, with c, claims what c allows of the
// keys that had nothing to do.
func (d *Driver) insertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams, c *ferrydriver.IngestClaimParams) ([]bool, []*ferrydriver.InboxRow, error) {
	res := make([]bool, len(p.Events))
	if len(p.Events) == 0 {
		return res, nil, nil
	}
	op := "insert into inbox of group " + p.Group
	var claimed []*ferrydriver.InboxRow
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		t := micros(now())
		idle, err := d.insertInboxTx(ctx, tx, p.Group, p.Events, res, t)
		if err != nil || c == nil || c.Keys <= 0 || len(idle) == 0 {
			return err
		}
		claimed, err = d.claimDue(ctx, tx, &ferrydriver.ClaimInboxParams{Group: p.Group, Worker: c.Worker, TTL: c.TTL,
			Limit: c.Keys * max(c.PerKey, 1), PerKey: max(c.PerKey, 1)}, idle[:min(len(idle), c.Keys)], t)
		return err
	})
	if err != nil {
		clear(res)
		return nil, nil, err
	}
	return res, claimed, nil
}

// insertInboxTx records events for group inside tx, setting inserted[i]
// for each new one, and makes the keys that had nothing to do runnable:
// it returns those, in key order.
func (d *Driver) insertInboxTx(ctx context.Context, tx *sql.Tx, group string, events []*ferryevent.Event, inserted []bool, t int64) ([]dueKey, error) {
	op := "insert into inbox of group " + group
	ins, err := tx.PrepareContext(ctx, `
INSERT INTO ferry_inbox (group_name, event_id, key, seq, topic, type, source, content_type, headers, payload, created_at, next_attempt_at, received_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (group_name, event_id) DO NOTHING`)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	defer ins.Close()
	var keys []string
	for i, ev := range events {
		c, err := encodeEvent(ev)
		if err != nil {
			return nil, err
		}
		r, err := ins.ExecContext(ctx, group, c.id, ev.Key, ev.Seq, ev.Topic, ev.Type, ev.Source, ev.ContentType, c.headers, c.payload, micros(ev.CreatedAt), t, t)
		if err != nil {
			return nil, d.wrapErr(op, err)
		}
		if n, _ := r.RowsAffected(); n == 1 {
			inserted[i] = true
			keys = append(keys, ev.Key)
		}
	}
	slices.Sort(keys)
	var idle []dueKey
	for _, k := range slices.Compact(keys) {
		// A key with nothing to do becomes runnable; one that waits (a
		// retry, a claim, a rescue, a dead head) keeps its time.
		var suspects int64
		err := tx.QueryRowContext(ctx, `
INSERT INTO ferry_inbox_keys (group_name, key, runnable_at) VALUES (?, ?, ?)
ON CONFLICT (group_name, key) DO UPDATE SET runnable_at = excluded.runnable_at
 WHERE runnable_at IS NULL AND held_by IS NULL AND claim_token IS NULL AND rescue_at IS NULL
RETURNING suspect_through`, group, k, t).Scan(&suspects)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, d.wrapErr(op, err)
		default:
			idle = append(idle, dueKey{key: k, suspects: suspects})
		}
	}
	return idle, nil
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
		rows, err := d.r.QueryContext(ctx, `SELECT `+inboxRowColumns+` FROM ferry_inbox i WHERE i.group_name = ? AND i.event_id IN (`+placeholders(len(chunk))+`)`, args...)
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
