package ferrysqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// SetInboxPolicy implements ferrydriver.Inbox.
func (d *Driver) SetInboxPolicy(ctx context.Context, p *ferrydriver.InboxPolicyParams) error {
	op := "store the dead policy of group " + p.Group
	return d.write(ctx, op, func(tx *sql.Tx) error {
		var old sql.NullBool
		err := tx.QueryRowContext(ctx, `SELECT hold_dead FROM ferry_inbox_groups WHERE group_name = ?`, p.Group).Scan(&old)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return d.wrapErr(op, err)
		}
		if old.Valid && old.Bool == p.HoldDead {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `
INSERT INTO ferry_inbox_groups (group_name, hold_dead) VALUES (?, ?)
ON CONFLICT (group_name) DO UPDATE SET hold_dead = excluded.hold_dead`, p.Group, p.HoldDead); err != nil {
			return d.wrapErr(op, err)
		}
		rows, err := tx.QueryContext(ctx, `SELECT key FROM ferry_inbox_keys WHERE group_name = ? ORDER BY key`, p.Group)
		if err != nil {
			return d.wrapErr("list inbox keys", err)
		}
		var keys []string
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return d.wrapErr("list inbox keys", err)
			}
			keys = append(keys, k)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return d.wrapErr("list inbox keys", err)
		}
		t := micros(now())
		for _, k := range keys {
			if err := d.refreshKey(ctx, tx, p.Group, k, t); err != nil {
				return err
			}
		}
		return nil
	})
}

// ListInbox implements ferrydriver.Inbox.
func (d *Driver) ListInbox(ctx context.Context, p *ferrydriver.ListInboxParams) ([]*ferrydriver.InboxRow, error) {
	q, args, err := listInboxQuery(p)
	if err != nil {
		return nil, err
	}
	rows, err := d.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, d.wrapErr("list inbox of group "+p.Group, err)
	}
	out, err := scanInboxRows(rows, p.Group)
	if err != nil {
		return nil, d.wrapErr("list inbox of group "+p.Group, err)
	}
	return out, nil
}

// listInboxQuery is ListInbox's statement and arguments.
func listInboxQuery(p *ferrydriver.ListInboxParams) (string, []any, error) {
	states := p.States
	if len(states) == 0 {
		states = []ferrydriver.InboxState{ferrydriver.InboxDead}
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	// The states are literals (checked), so that the partial indexes of
	// the states apply. PROCESSING is not stored: a row inside its key's
	// claim (inClaim) is stored PENDING or FAILED, and reads as PROCESSING.
	var stored, lits []string
	processing, claimable := false, false
	for _, s := range states {
		if !s.Valid() {
			return "", nil, fmt.Errorf("ferrysqlite: list inbox of group %s: %q is not an inbox state", p.Group, s)
		}
		switch s {
		case ferrydriver.InboxProcessing:
			processing = true
			stored = append(stored, "'pending'", "'failed'")
			continue
		case ferrydriver.InboxPending, ferrydriver.InboxFailed:
			claimable = true
		}
		stored, lits = append(stored, "'"+string(s)+"'"), append(lits, "'"+string(s)+"'")
	}
	slices.Sort(stored)
	stored = slices.Compact(stored)
	where := `state IN (` + strings.Join(stored, ", ") + `)`
	// SQLite uses a partial index only when the WHERE clause contains the
	// index's own condition, or the same term: each index that may serve
	// the list gets its condition written out.
	if len(stored) == 1 {
		where = `state = ` + stored[0] // the PROCESSED pages' index
		if stored[0] != "'processed'" {
			where += ` AND state <> 'processed'` // ferry_inbox_state_pages_idx
		}
	}
	allUnfinished := true
	for _, st := range states {
		allUnfinished = allUnfinished && slices.Contains([]ferrydriver.InboxState{ferrydriver.InboxPending, ferrydriver.InboxProcessing,
			ferrydriver.InboxFailed, ferrydriver.InboxDead}, st)
	}
	if allUnfinished {
		where += ` AND ` + unfinished // a key's rows: ferry_inbox_unfinished_idx
	}
	switch {
	case processing && len(lits) == 0:
		where += ` AND ` + inClaim
	case processing:
		where += ` AND (` + inClaim + ` OR state IN (` + strings.Join(lits, ", ") + `))`
	case claimable:
		where += ` AND NOT ` + inClaim
	}
	q := `SELECT ` + inboxRowColumns + ` FROM ferry_inbox i WHERE group_name = ? AND ` + where
	args := []any{p.Group}
	if p.Key != "" {
		q += ` AND key = ?`
		args = append(args, p.Key)
	}
	if p.Type != "" {
		q += ` AND type = ?`
		args = append(args, p.Type)
	}
	if len(p.EventIDs) > 0 {
		q += ` AND event_id IN (` + placeholders(len(p.EventIDs)) + `)`
		for _, id := range p.EventIDs {
			args = append(args, id.String())
		}
	}
	if !p.Since.IsZero() {
		q += ` AND finished_at >= ?`
		args = append(args, micros(p.Since))
	}
	if !p.Until.IsZero() {
		q += ` AND finished_at < ?`
		args = append(args, micros(p.Until))
	}
	if err := driverkit.CheckInboxCursor(p); err != nil {
		return "", nil, err
	}
	if c := p.After; c != nil {
		q += ` AND finished_at <= ? AND (finished_at, received_at, event_id) < (?, ?, ?)`
		args = append(args, micros(c.FinishedAt), micros(c.FinishedAt), micros(c.ReceivedAt), c.EventID.String())
	}
	// Unfinished rows first (no finished_at), newest received first. With
	// one state asked for, the rows are all finished or all not: the order
	// is then an index's (ferry_inbox_state_pages_idx, migration 12, for
	// an unfinished state), walked a page at a time instead of sorting the
	// state's rows.
	order := `finished_at IS NOT NULL, finished_at DESC, received_at DESC, event_id DESC`
	if len(states) == 1 {
		order = `finished_at DESC, received_at DESC, event_id DESC`
	}
	q += ` ORDER BY ` + order + ` LIMIT ?`
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

// setDeadState moves DEAD rows to state and recomputes their keys' heads
// under the group's stored policy.
func (d *Driver) setDeadState(ctx context.Context, p *ferrydriver.InboxIDsParams, state ferrydriver.InboxState) (int, error) {
	op := "mark dead letters " + string(state)
	changed := 0
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		changed = 0
		t := micros(now())
		keys := map[string]bool{}
		for _, id := range p.EventIDs {
			var key string
			err := tx.QueryRowContext(ctx, `
UPDATE ferry_inbox
   SET state = ?1,
       attempts = CASE WHEN ?1 = 'pending' THEN 0 ELSE attempts END,
       attempt_log = CASE WHEN ?1 = 'pending' THEN `+logAttempt("attempts", "'pending'", "''", "?2")+` ELSE attempt_log END,
       next_attempt_at = ?2,
       finished_at = CASE WHEN ?1 = 'discarded' THEN ?2 END -- a redriven row is unfinished again
 WHERE group_name = ?3 AND event_id = ?4 AND state = 'dead'
RETURNING key`, string(state), t, p.Group, id.String()).Scan(&key)
			if errors.Is(err, sql.ErrNoRows) {
				continue
			}
			if err != nil {
				return d.wrapErr(op, err)
			}
			keys[key] = true
			changed++
			if state.Finished() {
				d.events.note(settledNote{group: p.Group, id: id, state: state})
			}
		}
		for key := range keys {
			if err := d.refreshKey(ctx, tx, p.Group, key, t); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return changed, nil
}

// sqlInboxCounts counts each unfinished state of group ?1 up to ?2, through
// ferry_inbox_state_pages_idx (migration 12): O(cap). The states are
// literals, and the index's condition is repeated, so that the partial
// index applies. Rows inside claims (found through the claimed keys,
// ferry_inbox_keys_rescue_idx) count as PROCESSING, not as what they are
// stored as.
var sqlInboxCounts = func() string {
	var q []string
	for _, st := range []string{"pending", "processing", "failed", "dead"} {
		stored := `(SELECT count(*) FROM (SELECT 1 FROM ferry_inbox WHERE group_name = ?1 AND state = '` + st + `' AND state <> 'processed' LIMIT ?2))`
		switch st {
		case "processing":
			stored = `(SELECT count(*) FROM claimed)`
		case "pending", "failed":
			// At the cap it stays the cap: the count is "at least".
			stored = `(SELECT CASE WHEN n >= ?2 THEN n ELSE max(n - (SELECT count(*) FROM claimed WHERE state = '` + st + `'), 0) END FROM (SELECT ` + stored + ` AS n))`
		}
		q = append(q, `SELECT '`+st+`', `+stored)
	}
	return `
WITH claimed AS MATERIALIZED (
    SELECT i.state FROM ferry_inbox_keys c JOIN ferry_inbox i
        ON i.group_name = c.group_name AND i.key = c.key AND i.pos > c.claim_from AND i.pos <= c.claim_through
       AND i.` + unfinished + ` AND i.state IN ('pending', 'failed')
     WHERE c.group_name = ?1 AND c.rescue_at IS NOT NULL AND c.claim_token IS NOT NULL
     LIMIT ?2
)
` + strings.Join(q, " UNION ALL ")
}()

// sqlInboxGroups lists the groups whose policy is stored and those with
// keys in the inbox (a group whose consumer has not started yet: no
// stored policy, so holding), the keys' groups found by skipping from one
// group to the next along ferry_inbox_keys' primary key.
const sqlInboxGroups = `
WITH RECURSIVE kg(group_name, n) AS (
    SELECT (SELECT group_name FROM ferry_inbox_keys ORDER BY group_name LIMIT 1), 1
    UNION ALL
    SELECT (SELECT k.group_name FROM ferry_inbox_keys k WHERE k.group_name > kg.group_name ORDER BY k.group_name LIMIT 1), kg.n + 1
      FROM kg WHERE kg.group_name IS NOT NULL AND kg.n < ?1
)
SELECT n.group_name, COALESCE(p.hold_dead, 1)
  FROM (SELECT group_name FROM kg WHERE group_name IS NOT NULL
        UNION SELECT group_name FROM ferry_inbox_groups) n
  LEFT JOIN ferry_inbox_groups p ON p.group_name = n.group_name
 ORDER BY n.group_name LIMIT ?1`

// InboxGroups implements ferrydriver.Admin.
func (d *Driver) InboxGroups(ctx context.Context) ([]ferrydriver.GroupPolicy, error) {
	rows, err := d.r.QueryContext(ctx, sqlInboxGroups, driverkit.MaxListedGroups)
	if err != nil {
		return nil, d.wrapErr("list consumer groups", err)
	}
	defer rows.Close()
	var out []ferrydriver.GroupPolicy
	for rows.Next() {
		var g ferrydriver.GroupPolicy
		if err := rows.Scan(&g.Group, &g.HoldDead); err != nil {
			return nil, d.wrapErr("list consumer groups", err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("list consumer groups", err)
	}
	return out, nil
}

// InboxCounts implements ferrydriver.Inbox.
func (d *Driver) InboxCounts(ctx context.Context, group string) (map[ferrydriver.InboxState]int64, error) {
	rows, err := d.r.QueryContext(ctx, sqlInboxCounts, group, ferrydriver.InboxCountCap)
	if err != nil {
		return nil, d.wrapErr("count inbox rows of group "+group, err)
	}
	defer rows.Close()
	out := map[ferrydriver.InboxState]int64{}
	for rows.Next() {
		var state string
		var n int64
		if err := rows.Scan(&state, &n); err != nil {
			return nil, d.wrapErr("count inbox rows", err)
		}
		out[ferrydriver.InboxState(state)] = n
	}
	return out, d.wrapErr("count inbox rows", rows.Err())
}

// DeleteProcessedInbox implements ferrydriver.Inbox.
func (d *Driver) DeleteProcessedInbox(ctx context.Context, p *ferrydriver.DeleteProcessedInboxParams) (int64, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	var n int64
	err := d.write(ctx, "delete processed inbox rows of group "+p.Group, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `
DELETE FROM ferry_inbox WHERE pos IN (
    SELECT pos FROM ferry_inbox WHERE group_name = ? AND state = 'processed' AND finished_at < ?
     ORDER BY finished_at LIMIT ?)`, p.Group, micros(now())-p.OlderThan.Microseconds(), limit)
		if err != nil {
			return d.wrapErr("delete processed inbox rows of group "+p.Group, err)
		}
		n, _ = res.RowsAffected()
		// Forget keys with nothing left to run or hold; ingestion re-creates
		// a key's row when it needs one.
		_, err = tx.ExecContext(ctx, `
DELETE FROM ferry_inbox_keys WHERE group_name = ?1 AND key IN (
    SELECT k.key FROM ferry_inbox_keys k
     WHERE k.group_name = ?1 AND k.runnable_at IS NULL AND k.held_by IS NULL AND k.claim_token IS NULL AND k.rescue_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM ferry_inbox i WHERE i.group_name = k.group_name AND i.key = k.key AND i.`+unfinished+`)
     LIMIT ?2)`, p.Group, limit)
		return d.wrapErr("delete idle inbox keys of group "+p.Group, err)
	})
	return n, err
}

// logAttempt is a row's attempt_log (ferrydriver.Admin) with an
// entry appended for attempt n: the state it left the row in, its error cut
// to AttemptErrorChars, at (microseconds); the oldest entry goes when the
// history is full. Each argument is an SQL expression.
func logAttempt(n, state, err, at string) string {
	return `json_insert(CASE WHEN json_array_length(COALESCE(attempt_log, '[]')) >= ` + strconv.Itoa(driverkit.AttemptHistory) +
		` THEN json_remove(attempt_log, '$[0]') ELSE COALESCE(attempt_log, '[]') END, '$[#]', json_object('n', ` + n +
		`, 'state', ` + state + `, 'error', substr(` + err + `, 1, ` + strconv.Itoa(driverkit.AttemptErrorChars) + `), 'at', ` + at + `))`
}

// InboxAttempts implements ferrydriver.Admin.
func (d *Driver) InboxAttempts(ctx context.Context, p *ferrydriver.InboxAttemptsParams) ([]ferrydriver.AttemptRecord, error) {
	group, eventID := p.Group, p.EventID
	var text sql.NullString
	err := d.r.QueryRowContext(ctx, `SELECT attempt_log FROM ferry_inbox WHERE group_name = ? AND event_id = ?`, group, eventID.String()).Scan(&text)
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
		return nil, fmt.Errorf("ferrysqlite: the attempt log of event %s in group %s: %w", eventID, group, err)
	}
	out := make([]ferrydriver.AttemptRecord, len(entries))
	for i, e := range entries {
		out[i] = ferrydriver.AttemptRecord{Attempt: e.N, State: ferrydriver.InboxState(e.State), Error: e.Error, At: time.UnixMicro(e.At)}
	}
	return out, nil
}
