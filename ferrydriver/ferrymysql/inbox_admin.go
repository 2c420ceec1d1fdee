package ferrymysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// policySweepChunk is how many keys a policy change makes due per
// transaction.
const policySweepChunk = 1000

// SetInboxPolicy implements ferrydriver.Inbox. When the policy changed,
// every key of the group that is held or idle is made due, and the next
// claims compute its head under the new policy (a key whose head runs
// follows it when that head finishes). The keys are swept in key order, a
// chunk per transaction that also records how far the sweep got with the
// policy (migration 004): a call interrupted part-way leaves the sweep
// pending, and the next call resumes it.
func (d *Driver) SetInboxPolicy(ctx context.Context, p *ferrydriver.InboxPolicyParams) error {
	op := "store the dead policy of group " + p.Group
	var sweeping bool
	var gen int64
	var after []byte
	for {
		err := d.writeRC(ctx, op, func(tx *sql.Tx) error {
			var old sql.NullBool
			var pending bool
			var g int64
			var at []byte
			err := tx.QueryRowContext(ctx, `SELECT hold_dead, sweeping, sweep_gen, sweep_after FROM ferry_inbox_groups WHERE group_name = ? FOR UPDATE`,
				p.Group).Scan(&old, &pending, &g, &at)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				// A group's first policy; two consumers storing it at
				// once: the second finds the first's (duplicate key),
				// and runs again.
				_, err = tx.ExecContext(ctx, `INSERT INTO ferry_inbox_groups (group_name, hold_dead, sweeping, sweep_gen) VALUES (?, ?, TRUE, 1)`, p.Group, p.HoldDead)
				sweeping, gen, after = true, 1, nil
			case err != nil:
			case old.Bool != p.HoldDead:
				_, err = tx.ExecContext(ctx, `UPDATE ferry_inbox_groups SET hold_dead = ?, sweeping = TRUE, sweep_after = NULL, sweep_gen = sweep_gen + 1 WHERE group_name = ?`,
					p.HoldDead, p.Group)
				sweeping, gen, after = true, g+1, nil
			default:
				sweeping, gen, after = pending, g, at
			}
			if err != nil {
				return d.wrapErr(op, err)
			}
			return nil
		})
		if errNumber(err) == errDupEntry && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	for chunk := 0; sweeping; chunk++ {
		p.StartChunk(chunk)
		var last []byte
		var more bool
		err := d.writeRC(ctx, op, func(tx *sql.Tx) error {
			from := after
			if from == nil {
				from = []byte{}
			}
			rows, err := tx.QueryContext(ctx, `SELECT k FROM ferry_inbox_keys FORCE INDEX (PRIMARY) WHERE group_name = ? AND k > ? AND runnable_at IS NULL
   AND claim_token IS NULL AND rescue_at IS NULL ORDER BY k LIMIT ?`,
				p.Group, from, policySweepChunk)
			if err != nil {
				return d.wrapErr(op, err)
			}
			args := []any{p.Group}
			last = after
			for rows.Next() {
				var k []byte
				if err := rows.Scan(&k); err != nil {
					rows.Close()
					return d.wrapErr(op, err)
				}
				args, last = append(args, k), k
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return d.wrapErr(op, err)
			}
			if len(args) > 1 {
				if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY) SET runnable_at = `+sqlNow+`, held_by = NULL
 WHERE group_name = ? AND k IN (`+marks(len(args)-1)+`) AND runnable_at IS NULL AND claim_token IS NULL AND rescue_at IS NULL`, args...); err != nil {
					return d.wrapErr(op, err)
				}
			}
			more = len(args)-1 == policySweepChunk
			// Progress of this generation only, never moved back by a
			// sweep behind a concurrent one; its end, whoever reaches it.
			if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_groups SET sweeping = ?, sweep_after = IF(?, ?, NULL)
 WHERE group_name = ? AND sweep_gen = ? AND sweeping AND (NOT ? OR sweep_after IS NULL OR sweep_after < ?)`,
				more, more, last, p.Group, gen, more, last); err != nil {
				return d.wrapErr("record the policy sweep of group "+p.Group, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		after, sweeping = last, more
	}
	return nil
}

// ListInbox implements ferrydriver.Inbox: a page of each state asked for,
// each a range of ferry_inbox_pages_idx (ferry_inbox_key_pages_idx with a
// key) walked from its newest row, merged; with event IDs, those events
// looked up by ferry_inbox_event_idx.
func (d *Driver) ListInbox(ctx context.Context, p *ferrydriver.ListInboxParams) ([]*ferrydriver.InboxRow, error) {
	q, args, err := listInboxQuery(p)
	if err != nil {
		return nil, err
	}
	rows, err := d.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, d.wrapErr("list inbox of group "+p.Group, err)
	}
	out, err := scanInboxRows(rows, p.Group)
	if err != nil {
		return nil, d.wrapErr("list inbox of group "+p.Group, err)
	}
	return out, nil
}

// listInboxQuery is ListInbox's statement and arguments: for each state
// one SELECT of at most the limit, in the index's order (newest finished,
// newest received, then event ID, all descending), so that each reads a
// page; UNION ALL of them sorted again (unfinished rows, which have no
// finish time, first) and cut to the limit.
func listInboxQuery(p *ferrydriver.ListInboxParams) (string, []any, error) {
	states := p.States
	if len(states) == 0 {
		states = []ferrydriver.InboxState{ferrydriver.InboxDead}
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	if err := driverkit.CheckInboxCursor(p); err != nil {
		return "", nil, err
	}
	seen := map[ferrydriver.InboxState]bool{}
	var parts []string
	var args []any
	index := "ferry_inbox_pages_idx"
	switch {
	case len(p.EventIDs) > 0:
		index = "ferry_inbox_event_idx" // the events, looked up: a page's order is a sort of them
	case p.Key != "":
		index = "ferry_inbox_key_pages_idx"
	}
	for _, st := range states {
		if !st.Valid() {
			return "", nil, fmt.Errorf("ferrymysql: list inbox of group %s: %q is not an inbox state", p.Group, st)
		}
		if seen[st] {
			continue
		}
		seen[st] = true
		var q string
		switch st {
		case ferrydriver.InboxProcessing:
			// Not stored: the rows inside the group's claims, found
			// through its claimed keys (a range of
			// ferry_inbox_keys_rescue_idx: a claim's rescue is due at its
			// expiry), each a range of ferry_inbox_head_idx.
			q = `SELECT ` + rowColumns + `, TRUE FROM ferry_inbox_keys c FORCE INDEX (ferry_inbox_keys_rescue_idx)
  JOIN ferry_inbox i FORCE INDEX (ferry_inbox_head_idx)
    ON i.group_name = c.group_name AND i.k = c.k AND i.state IN ('pending', 'failed') AND i.pos > c.claim_from AND i.pos <= c.claim_through
 WHERE c.group_name = ? AND c.rescue_at IS NOT NULL AND c.claim_token IS NOT NULL`
			args = append(args, p.Group)
		default:
			// A PENDING or FAILED row inside a claim reads as PROCESSING:
			// each looks its key up (by primary key).
			q = `SELECT ` + rowColumns + `, FALSE FROM ferry_inbox i FORCE INDEX (` + index + `) WHERE i.group_name = ? AND i.state = ?`
			args = append(args, p.Group, string(st))
			if st == ferrydriver.InboxPending || st == ferrydriver.InboxFailed {
				q += ` AND NOT ` + inClaim
			}
		}
		if p.Key != "" {
			q += ` AND i.k = ?`
			args = append(args, p.Key)
		}
		if p.Type != "" {
			q += ` AND i.type = ?`
			args = append(args, p.Type)
		}
		if len(p.EventIDs) > 0 {
			q += ` AND i.event_id IN (` + marks(len(p.EventIDs)) + `)`
			args = idArgs(args, p.EventIDs)
		}
		if !p.Since.IsZero() {
			q += ` AND i.finished_at >= ?`
			args = append(args, micros(p.Since))
		}
		if !p.Until.IsZero() {
			q += ` AND i.finished_at < ?`
			args = append(args, micros(p.Until))
		}
		if c := p.After; c != nil {
			f, r := micros(c.FinishedAt), micros(c.ReceivedAt)
			q += ` AND i.finished_at <= ? AND (i.finished_at < ? OR i.received_at < ? OR (i.received_at = ? AND i.event_id < ?))`
			args = append(args, f, f, r, r, c.EventID[:])
		}
		parts = append(parts, `(`+q+` ORDER BY i.finished_at DESC, i.received_at DESC, i.event_id DESC LIMIT ?)`)
		args = append(args, limit)
	}
	if len(parts) == 1 {
		return strings.TrimSuffix(strings.TrimPrefix(parts[0], "("), ")"), args, nil
	}
	q := strings.Join(parts, " UNION ALL ") + ` ORDER BY 16 IS NOT NULL, 16 DESC, 15 DESC, 1 DESC LIMIT ?`
	return q, append(args, limit), nil
}

// RedriveInbox implements ferrydriver.Inbox.
func (d *Driver) RedriveInbox(ctx context.Context, p *ferrydriver.InboxIDsParams) (int, error) {
	return d.setDeadState(ctx, p, ferrydriver.InboxPending)
}

// DiscardInbox implements ferrydriver.Inbox.
func (d *Driver) DiscardInbox(ctx context.Context, p *ferrydriver.InboxIDsParams) (int, error) {
	return d.setDeadState(ctx, p, ferrydriver.InboxDiscarded)
}

// setDeadState moves DEAD rows to state (a redrive resets their attempts
// and logs itself) and makes their keys due, released: the next claim
// computes each key's head under the group's stored policy.
func (d *Driver) setDeadState(ctx context.Context, p *ferrydriver.InboxIDsParams, state ferrydriver.InboxState) (int, error) {
	op := "mark dead events " + string(state)
	ids := slices.Clone(p.EventIDs)
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return strings.Compare(string(a[:]), string(b[:])) })
	ids = slices.Compact(ids)
	changed := 0
	err := d.writeRC(ctx, op, func(tx *sql.Tx) error {
		changed = 0
		var keys []string
		err := chunks(ids, inListChunk, func(ids []uuid.UUID) error {
			// The rows first (each locked by the unique index: in ID
			// order), then their keys.
			rows, err := tx.QueryContext(ctx, `SELECT event_id, k FROM ferry_inbox FORCE INDEX (ferry_inbox_event_idx) WHERE group_name = ? AND event_id IN (`+marks(len(ids))+`) AND state = 'dead'
 ORDER BY event_id FOR UPDATE`, idArgs([]any{p.Group}, ids)...)
			if err != nil {
				return err
			}
			var dead []uuid.UUID
			for rows.Next() {
				var id, k []byte
				if err := rows.Scan(&id, &k); err != nil {
					rows.Close()
					return err
				}
				u, err := uuid.FromBytes(id)
				if err != nil {
					rows.Close()
					return err
				}
				dead = append(dead, u)
				keys = append(keys, string(k))
			}
			rows.Close()
			if err := rows.Err(); err != nil || len(dead) == 0 {
				return err
			}
			q := `UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx) SET state = 'discarded', finished_at = ` + sqlNow + `, next_attempt_at = ` + sqlNow
			if state == ferrydriver.InboxPending {
				// The log first: it reads the attempts the redrive resets.
				q = `UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx) SET attempt_log = ` + logAttempt("attempts", "'pending'", "''") + `,
       state = 'pending', attempts = 0, finished_at = NULL, next_attempt_at = ` + sqlNow
			}
			res, err := tx.ExecContext(ctx, q+` WHERE group_name = ? AND event_id IN (`+marks(len(dead))+`) AND state = 'dead'`, idArgs([]any{p.Group}, dead)...)
			if err != nil {
				return err
			}
			n, _ := res.RowsAffected()
			changed += int(n)
			return nil
		})
		if err != nil {
			return d.wrapErr(op, err)
		}
		_, err = d.touchKeys(ctx, tx, p.Group, keys, true)
		return err
	})
	if err != nil {
		return 0, err
	}
	return changed, nil
}

// sqlInboxCounts counts each unfinished state of group ? up to ?, each a
// range of ferry_inbox_pages_idx read from the index alone: O(cap). Rows
// inside claims (found through the claimed keys, a range of
// ferry_inbox_keys_rescue_idx) count as PROCESSING, not as what they are
// stored as; a count at the cap stays the cap ("at least").
var sqlInboxCounts = func() string {
	stored := func(st string) string {
		return `(SELECT COUNT(*) FROM (SELECT 1 FROM ferry_inbox WHERE group_name = ? AND state = '` + st + `' LIMIT ?) s)`
	}
	claimed := func(st string) string {
		return `(SELECT COUNT(*) FROM (SELECT 1 FROM ferry_inbox_keys c FORCE INDEX (ferry_inbox_keys_rescue_idx)
  JOIN ferry_inbox i FORCE INDEX (ferry_inbox_head_idx)
    ON i.group_name = c.group_name AND i.k = c.k AND i.state IN (` + st + `) AND i.pos > c.claim_from AND i.pos <= c.claim_through
 WHERE c.group_name = ? AND c.rescue_at IS NOT NULL AND c.claim_token IS NOT NULL LIMIT ?) s)`
	}
	var q []string
	for _, st := range []string{"pending", "failed"} {
		q = append(q, `SELECT '`+st+`', IF(n >= ?, n, GREATEST(n - `+claimed("'"+st+"'")+`, 0)) FROM (SELECT `+stored(st)+` AS n) x`)
	}
	q = append(q, `SELECT 'processing', `+claimed("'pending', 'failed'"), `SELECT 'dead', `+stored("dead"))
	return strings.Join(q, " UNION ALL ")
}()

// inboxCountsArgs are sqlInboxCounts' arguments.
func inboxCountsArgs(group string) []any {
	c := ferrydriver.InboxCountCap
	return []any{c, group, c, group, c, c, group, c, group, c, group, c, group, c}
}

// InboxCounts implements ferrydriver.Inbox.
func (d *Driver) InboxCounts(ctx context.Context, group string) (map[ferrydriver.InboxState]int64, error) {
	rows, err := d.db.QueryContext(ctx, sqlInboxCounts, inboxCountsArgs(group)...)
	if err != nil {
		return nil, d.wrapErr("count inbox rows of group "+group, err)
	}
	defer rows.Close()
	out := map[ferrydriver.InboxState]int64{}
	for rows.Next() {
		var state string
		var n int64
		if err := rows.Scan(&state, &n); err != nil {
			return nil, d.wrapErr("count inbox rows of group "+group, err)
		}
		out[ferrydriver.InboxState(state)] = n
	}
	return out, d.wrapErr("count inbox rows of group "+group, rows.Err())
}

// Retention's statements: the group's oldest processed rows (a range of
// ferry_inbox_pages_idx), and keys with nothing to run or hold (the NULL
// range of ferry_inbox_keys_runnable_idx).
const (
	sqlDeleteProcessed = `DELETE FROM ferry_inbox WHERE group_name = ? AND state = 'processed' AND finished_at < ` + sqlNow + ` - ?
 ORDER BY finished_at LIMIT ?`
	sqlForgetKeys = `DELETE FROM ferry_inbox_keys WHERE group_name = ? AND runnable_at IS NULL AND held_by IS NULL
   AND claim_token IS NULL AND rescue_at IS NULL LIMIT ?`
)

// DeleteProcessedInbox implements ferrydriver.Inbox: the group's oldest
// PROCESSED rows, a range of ferry_inbox_pages_idx, then up to as many of
// its keys with nothing to run or hold (the runnable index's NULL range),
// each statement its own transaction. A key forgotten here is made again
// by the next event ingested for it (or redriven): an ingester locks a
// key's row after inserting, and creates it when it is gone.
func (d *Driver) DeleteProcessedInbox(ctx context.Context, p *ferrydriver.DeleteProcessedInboxParams) (int64, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	res, err := d.db.ExecContext(ctx, sqlDeleteProcessed, p.Group, p.OlderThan.Microseconds(), limit)
	if err != nil {
		return 0, d.wrapErr("delete processed inbox rows of group "+p.Group, err)
	}
	n, _ := res.RowsAffected()
	if _, err := d.db.ExecContext(ctx, sqlForgetKeys, p.Group, limit); err != nil {
		return n, d.wrapErr("delete idle inbox keys of group "+p.Group, err)
	}
	return n, nil
}

// sqlInboxGroups lists the groups whose policy is stored and those with
// keys in the inbox (a group whose consumer has not started yet: no
// stored policy, so holding), the keys' groups by a loose scan of
// ferry_inbox_keys' primary key (one dive per group).
const sqlInboxGroups = `
SELECT n.g, COALESCE(p.hold_dead, TRUE)
  FROM (SELECT DISTINCT group_name AS g FROM ferry_inbox_keys
        UNION SELECT group_name FROM ferry_inbox_groups) n
  LEFT JOIN ferry_inbox_groups p ON p.group_name = n.g
 ORDER BY n.g LIMIT ?`

// InboxGroups implements ferrydriver.Admin.
func (d *Driver) InboxGroups(ctx context.Context) ([]ferrydriver.GroupPolicy, error) {
	rows, err := d.db.QueryContext(ctx, sqlInboxGroups, driverkit.MaxListedGroups)
	if err != nil {
		return nil, d.wrapErr("list consumer groups", err)
	}
	defer rows.Close()
	var out []ferrydriver.GroupPolicy
	for rows.Next() {
		var g ferrydriver.GroupPolicy
		var name []byte
		if err := rows.Scan(&name, &g.HoldDead); err != nil {
			return nil, d.wrapErr("list consumer groups", err)
		}
		g.Group = string(name)
		out = append(out, g)
	}
	return out, d.wrapErr("list consumer groups", rows.Err())
}

// InboxAttempts implements ferrydriver.Admin.
func (d *Driver) InboxAttempts(ctx context.Context, p *ferrydriver.InboxAttemptsParams) ([]ferrydriver.AttemptRecord, error) {
	group, eventID := p.Group, p.EventID
	var text sql.NullString
	err := d.db.QueryRowContext(ctx, `SELECT attempt_log FROM ferry_inbox WHERE group_name = ? AND event_id = ?`, group, eventID[:]).Scan(&text)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !text.Valid) {
		return nil, nil
	}
	if err != nil {
		return nil, d.wrapErr("read the attempts of event "+eventID.String(), err)
	}
	var entries []struct {
		N     int    `json:"n"`
		State string `json:"state"`
		Error string `json:"error"`
		At    int64  `json:"at"`
	}
	if err := json.Unmarshal([]byte(text.String), &entries); err != nil {
		return nil, fmt.Errorf("ferrymysql: the attempt log of event %s in group %s: %w", eventID, group, err)
	}
	out := make([]ferrydriver.AttemptRecord, len(entries))
	for i, e := range entries {
		out[i] = ferrydriver.AttemptRecord{Attempt: e.N, State: ferrydriver.InboxState(e.State), Error: e.Error, At: fromMicros(e.At)}
	}
	return out, nil
}
