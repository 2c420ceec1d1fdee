package ferrymysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// The inbox follows SQLite's model: one ferry_inbox row per (group,
// event), one ferry_inbox_keys row per (group, key) saying when the key's
// head may run, claims of each key's head and a run of the PENDING rows
// after it (runs.go) with a token and an expiry. With concurrent writers:
//   - claims lock due keys with SELECT ... FOR UPDATE SKIP LOCKED and the
//     heads they take the same way, so that workers never wait for each
//     other, and they alone compute a key's head, at READ COMMITTED (see
//     claim.go);
//   - a finish (CompleteInboxTx in the handler's transaction, FailInbox)
//     changes its row, fenced by the claim's token and expiry, and makes
//     its key due now (unless the key's run goes on), in a statement more;
//   - an ingester reads which of its events exist, inserts the others and
//     then locks their keys, so that no statement of it checks a duplicate
//     key (see 002_inbox.up.sql);
//   - every writer of a key's rows locks the key's row after the rows it
//     changes, and a claim, which locks them the other way round, never
//     waits: no cycle of waits, so no deadlock among them.

// inboxRowColumns are the columns scanInboxRow reads, of an inbox row i,
// the last saying whether the row is inside its key's claim (inClaim).
const inboxRowColumns = rowColumns + `, ` + inClaim

// rowColumns are inboxRowColumns but the last, for a statement that knows
// whether its rows are claimed.
const rowColumns = `i.event_id, i.k, i.seq, i.topic, i.type, i.source, i.content_type, i.headers, i.payload, i.created_at,
       i.state, i.attempts, COALESCE(i.last_error, ''), i.next_attempt_at, i.received_at, i.finished_at`

// noClaim is the SET of a key whose claim ends (after the columns that
// read it: MySQL assigns left to right).
const noClaim = `claim_token = NULL, claimed_by = NULL, claim_from = NULL, claim_through = NULL, claim_expires_at = NULL`

// inClaim says whether inbox row i is inside its key's claim (one that
// expired included: its rows are PROCESSING until a rescue takes them).
// Only a PENDING or FAILED row can be: such a row reads as PROCESSING, its
// attempt counted (its finish stores it). The key is read by its primary
// key.
const inClaim = `(i.state IN ('pending', 'failed') AND EXISTS (
        SELECT 1 FROM ferry_inbox_keys c FORCE INDEX (PRIMARY)
         WHERE c.group_name = i.group_name AND c.k = i.k AND c.claim_token IS NOT NULL
           AND i.pos > c.claim_from AND i.pos <= c.claim_through))`

func scanInboxRows(rows *sql.Rows, group string) ([]*ferrydriver.InboxRow, error) {
	defer rows.Close()
	var out []*ferrydriver.InboxRow
	for rows.Next() {
		row, err := scanInboxRow(rows, group)
		if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

func scanInboxRow(rows *sql.Rows, group string, extra ...any) (*ferrydriver.InboxRow, error) {
	row := &ferrydriver.InboxRow{Group: group}
	ev := &row.Event
	var id, key, headers, lastError []byte
	var state string
	var created, next, received int64
	var finished sql.NullInt64
	var claimed bool
	dest := append([]any{&id, &key, &ev.Seq, &ev.Topic, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created,
		&state, &row.Attempts, &lastError, &next, &received, &finished, &claimed}, extra...)
	if err := rows.Scan(dest...); err != nil {
		return nil, err
	}
	if claimed {
		state, row.Attempts = string(ferrydriver.InboxProcessing), row.Attempts+1
	}
	u, err := uuid.FromBytes(id)
	if err != nil {
		return nil, fmt.Errorf("inbox row with event id %x: %w", id, err)
	}
	ev.ID, ev.Key, row.LastError = u, string(key), string(lastError)
	if ev.Payload == nil {
		ev.Payload = []byte{}
	}
	if err := decodeHeaders(ev, headers); err != nil {
		return nil, err
	}
	row.State = ferrydriver.InboxState(state)
	ev.CreatedAt, row.NextAttemptAt, row.ReceivedAt = fromMicros(created), fromMicros(next), fromMicros(received)
	if finished.Valid {
		row.FinishedAt = fromMicros(finished.Int64)
	}
	return row, nil
}

// marks returns "?, ?, ..." for n values.
func marks(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// inListChunk bounds the values of one IN list: a statement over more
// rows or keys runs once per chunk.
const inListChunk = 500

// chunks calls fn with successive chunks of at most n of s.
func chunks[T any](s []T, n int, fn func([]T) error) error {
	for start := 0; start < len(s); start += n {
		if err := fn(s[start:min(start+n, len(s))]); err != nil {
			return err
		}
	}
	return nil
}

// idArgs appends the IDs' stored form to args.
func idArgs(args []any, ids []uuid.UUID) []any {
	for _, id := range ids {
		args = append(args, id[:])
	}
	return args
}

// maxInsertRuns bounds the runs of an ingestion that meets concurrent
// duplicates of its events.
const maxInsertRuns = 10

// InsertInbox implements ferrydriver.Inbox, in one READ COMMITTED
// transaction: which of the events the group has is read, the others are
// inserted in delivery order, and their keys are made due (created if
// new). A concurrent delivery of the same events makes the insert fail
// (duplicate key) or deadlock: the transaction then runs again, and reads
// them.
func (d *Driver) InsertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams) ([]bool, error) {
	res, _, err := d.insertInbox(ctx, p, nil)
	return res, err
}

var _ ferrydriver.InboxIngestClaimer = (*Driver)(nil)

// InsertInboxClaim implements ferrydriver.InboxIngestClaimer: InsertInbox
// whose transaction, once it holds the keys' rows (touchKeys), claims as
// a claim would (claimDue) the new rows of up to c.Keys of the keys that
// had nothing to do, in key order.
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
	var err error
	for run := 1; run <= maxInsertRuns; run++ {
		err = d.writeRC(ctx, op, func(tx *sql.Tx) error {
			clear(res)
			claimed = nil
			free, err := d.insertInboxTx(ctx, tx, p.Group, p.Events, res)
			if err != nil || c == nil || c.Keys <= 0 || len(free) == 0 {
				return err
			}
			// Of the keys free of claims, holds and rescues, those whose
			// head is a row inserted here had nothing else to do.
			ours := map[uuid.UUID]bool{}
			for i, ev := range p.Events {
				if res[i] {
					ours[ev.ID] = true
				}
			}
			// The heads of one IN list of keys at most: an ingest of more
			// keys claims among the first.
			claimed, err = d.claimDue(ctx, tx, &ferrydriver.ClaimInboxParams{Group: p.Group, Worker: c.Worker, TTL: c.TTL,
				Limit: c.Keys * max(c.PerKey, 1), PerKey: max(c.PerKey, 1), Keys: c.Keys}, free[:min(len(free), inListChunk)], ours)
			return d.wrapErr(op, err)
		})
		if errNumber(err) != errDupEntry || ctx.Err() != nil {
			break
		}
		d.duplicates.Add(1)
		time.Sleep(rerunPause(run))
	}
	if err != nil {
		return nil, nil, err
	}
	return res, claimed, nil
}

// existingEvents returns which of ids group has (a consistent read: no
// lock).
func existingEvents(ctx context.Context, q querier, group string, ids []uuid.UUID) (map[uuid.UUID]bool, error) {
	have := map[uuid.UUID]bool{}
	err := chunks(ids, inListChunk, func(ids []uuid.UUID) error {
		rows, err := q.QueryContext(ctx, `SELECT event_id FROM ferry_inbox FORCE INDEX (ferry_inbox_event_idx) WHERE group_name = ? AND event_id IN (`+marks(len(ids))+`)`,
			idArgs([]any{group}, ids)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var b []byte
			if err := rows.Scan(&b); err != nil {
				return err
			}
			if u, err := uuid.FromBytes(b); err == nil {
				have[u] = true
			}
		}
		return rows.Err()
	})
	return have, err
}

// inboxChunkBytes bounds one INSERT of inbox rows (max_allowed_packet is
// 16 MiB by default on MariaDB).
const inboxChunkBytes = 4 << 20

// insertInboxTx records the events group does not have yet inside tx,
// setting inserted[i] for each, and makes their keys due; it returns the
// keys free of claims, holds and rescues, in key order, locked.
func (d *Driver) insertInboxTx(ctx context.Context, tx *sql.Tx, group string, events []*ferryevent.Event, inserted []bool) ([]*dueKey, error) {
	keys, err := d.insertInboxRows(ctx, tx, group, events, inserted)
	if err != nil {
		return nil, err
	}
	// A key with nothing to do becomes due; one that waits (a retry, a
	// running row, a dead head) keeps its time.
	return d.touchKeys(ctx, tx, group, keys, false)
}

// insertInboxRows inserts the rows of the events group does not have yet,
// in their order, and returns their keys.
func (d *Driver) insertInboxRows(ctx context.Context, tx *sql.Tx, group string, events []*ferryevent.Event, inserted []bool) ([]string, error) {
	op := "insert into inbox of group " + group
	ids := make([]uuid.UUID, len(events))
	for i, ev := range events {
		ids[i] = ev.ID
	}
	have, err := existingEvents(ctx, tx, group, ids)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	var (
		sqlb  strings.Builder
		args  []any
		size  int
		keys  []string
		flush = func() error {
			if len(args) == 0 {
				return nil
			}
			_, err := tx.ExecContext(ctx, sqlb.String(), args...)
			sqlb.Reset()
			args, size = args[:0], 0
			return d.wrapErr(op, err)
		}
	)
	for i, ev := range events {
		if have[ev.ID] {
			continue
		}
		have[ev.ID] = true // a second copy in the batch is a duplicate
		c, err := encodeEvent(ev)
		if err != nil {
			return nil, err
		}
		if size > 0 && size+len(c.payload) > inboxChunkBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		if len(args) == 0 {
			sqlb.WriteString(`INSERT INTO ferry_inbox (group_name, event_id, k, seq, topic, type, source, content_type, headers, payload, created_at, next_attempt_at, received_at) VALUES `)
		} else {
			sqlb.WriteString(", ")
		}
		sqlb.WriteString(`(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ` + sqlNow + `, ` + sqlNow + `)`)
		args = append(args, group, c.id, ev.Key, ev.Seq, ev.Topic, ev.Type, ev.Source, ev.ContentType, c.headers, c.payload, micros(ev.CreatedAt))
		size += len(c.payload) + 512
		inserted[i] = true
		keys = append(keys, ev.Key)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return keys, nil
}

// touchKeys makes keys of group due now, in a READ COMMITTED transaction:
// those with nothing to do (release: all that are not claimed, and the
// DEAD rows they were held by no longer hold them), creating the rows of
// keys that have none. The rows are locked in key order (the primary key's), as every
// writer of several keys does. It returns the keys free of claims, holds
// and rescues (new ones too), in key order, with how far their rows are
// suspect.
func (d *Driver) touchKeys(ctx context.Context, tx *sql.Tx, group string, keys []string, release bool) ([]*dueKey, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	op := "make inbox keys of group " + group + " due"
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var free []*dueKey
	err := chunks(keys, inListChunk, func(keys []string) error {
		args := []any{group}
		for _, k := range keys {
			args = append(args, k)
		}
		rows, err := tx.QueryContext(ctx, `SELECT k, held_by IS NULL AND claim_token IS NULL AND rescue_at IS NULL, suspect_through
  FROM ferry_inbox_keys FORCE INDEX (PRIMARY) WHERE group_name = ? AND k IN (`+marks(len(keys))+`) ORDER BY k FOR UPDATE`, args...)
		if err != nil {
			return d.wrapErr(op, err)
		}
		exists := map[string]*dueKey{}
		for rows.Next() {
			var k []byte
			var free bool
			var suspects int64
			if err := rows.Scan(&k, &free, &suspects); err != nil {
				rows.Close()
				return d.wrapErr(op, err)
			}
			exists[string(k)] = nil
			if free {
				exists[string(k)] = &dueKey{key: string(k), suspects: suspects}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return d.wrapErr(op, err)
		}
		var missing []any
		for _, k := range keys {
			due, ok := exists[k]
			if !ok {
				missing = append(missing, group, k)
				due = &dueKey{key: k}
			}
			if due != nil {
				free = append(free, due)
			}
		}
		if len(exists) > 0 {
			// A claimed key is left to its claim's finish, or to the rescue
			// of its expiry, which make it due; a key whose head is suspect
			// is due for a rescue (released) or keeps its time.
			q := `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY) SET runnable_at = ` + sqlNow + `
 WHERE group_name = ? AND k IN (` + marks(len(keys)) + `) AND runnable_at IS NULL AND held_by IS NULL AND claim_token IS NULL AND rescue_at IS NULL`
			if release {
				// Assigned left to right: runnable_at reads rescue_at
				// before its own assignment.
				q = `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY)
   SET runnable_at = IF(rescue_at IS NULL, ` + sqlNow + `, NULL), rescue_at = IF(rescue_at IS NULL, NULL, ` + sqlNow + `), held_by = NULL
 WHERE group_name = ? AND k IN (` + marks(len(keys)) + `) AND claim_token IS NULL`
			}
			if _, err := tx.ExecContext(ctx, q, args...); err != nil {
				return d.wrapErr(op, err)
			}
		}
		if len(missing) > 0 {
			// Keys that cannot exist yet (none was found, and their rows
			// are only made here, where a duplicate runs the transaction
			// again).
			if _, err := tx.ExecContext(ctx, `INSERT INTO ferry_inbox_keys (group_name, k, runnable_at) VALUES `+
				strings.TrimSuffix(strings.Repeat(`(?, ?, `+sqlNow+`), `, len(missing)/2), ", "), missing...); err != nil {
				return d.wrapErr(op, err)
			}
		}
		return nil
	})
	return free, err
}

// holdPolicy is the SQL of group ?'s stored policy (holding when none).
const holdPolicy = `COALESCE((SELECT hold_dead FROM ferry_inbox_groups WHERE group_name = ?), TRUE)`

// InboxStates implements ferrydriver.Settler: autocommit reads of the
// pool, each seeing what committed before it began (never a caller's
// snapshot).
func (d *Driver) InboxStates(ctx context.Context, p *ferrydriver.InboxIDsParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	out := make(map[uuid.UUID]*ferrydriver.InboxRow, len(p.EventIDs))
	err := chunks(p.EventIDs, 500, func(ids []uuid.UUID) error {
		rows, err := d.db.QueryContext(ctx, `SELECT `+inboxRowColumns+` FROM ferry_inbox i FORCE INDEX (ferry_inbox_event_idx) WHERE i.group_name = ? AND i.event_id IN (`+marks(len(ids))+`)`,
			idArgs([]any{p.Group}, ids)...)
		if err != nil {
			return err
		}
		got, err := scanInboxRows(rows, p.Group)
		for _, row := range got {
			out[row.Event.ID] = row
		}
		return err
	})
	if err != nil {
		return nil, d.wrapErr("read inbox states of group "+p.Group, err)
	}
	return out, nil
}

// logAttempt is a row's attempt_log (ferrydriver.Admin) with an
// entry appended for attempt n: the state it left the row in, its error
// (an SQL expression of valid UTF-8 already cut to AttemptErrorChars: see
// attemptError), now; the oldest entry goes when the history is full.
// Each argument is an SQL expression. In an UPDATE it must come before
// the assignments of the columns it reads: MySQL assigns left to right,
// each later one reading the earlier ones' new values.
func logAttempt(n, state, err string) string {
	return `JSON_ARRAY_APPEND(IF(JSON_LENGTH(COALESCE(attempt_log, '[]')) >= ` + fmt.Sprint(driverkit.AttemptHistory) +
		`, JSON_REMOVE(attempt_log, '$[0]'), COALESCE(attempt_log, '[]')), '$', JSON_OBJECT('n', ` + n + `, 'state', ` + state +
		`, 'error', ` + err + `, 'at', ` + sqlNow + `))`
}

// attemptError is a history entry's error: valid UTF-8 (the log is JSON
// text), its first AttemptErrorChars characters.
func attemptError(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	n := 0
	for i := range s {
		if n == driverkit.AttemptErrorChars {
			return s[:i]
		}
		n++
	}
	return s
}

// MaxConns implements ferrydriver.Inbox: database/sql's MaxOpenConns.
func (d *Driver) MaxConns() int { return d.db.Stats().MaxOpenConnections }

var _ ferrydriver.Inbox[*sql.Tx] = (*Driver)(nil)
