package ferrymysql

import (
	"cmp"
	"context"
	"database/sql"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
)

// Claims live on the key's row (migration 004), as PostgreSQL's and
// SQLite's: a claim takes a run of a key's next rows in order (its head
// and, after a PENDING head, the PENDING rows after it), with one token
// and one expiry, and stores the range of positions it covers
// (claim_from < pos <= claim_through) on ferry_inbox_keys; the rows are
// not written until their outcomes are known, and a PENDING or FAILED row
// inside its key's claim reads as PROCESSING, its attempt counted. A
// claim that expired is rescued: every row it covered counts the attempt,
// and they run one at a time (suspect_through), each under a claim of its
// own. What a claim does with a key is inboxmodel's (ClaimKey,
// RescueKey, NextUnclaimed).
//
// A claim is one READ COMMITTED transaction of a few statements, whatever
// it claims:
//
//  1. the due keys (runnable_at, or rescue_at for a rescue), locked with
//     FOR UPDATE SKIP LOCKED, oldest due first, with their claims;
//  2. a rescue charges the rows of each expired claim their attempt
//     (locked with SKIP LOCKED: a row another transaction holds is one it
//     is finishing or retracting);
//  3. each key's head, read afresh (no lock): the least position of its
//     oldest pending and failed rows (and dead ones, under the hold
//     policy), each the first entry of a range of ferry_inbox_head_idx;
//     the index is forced: on a table whose statistics predate its rows
//     (a backlog just ingested) the optimizer picked plans that read the
//     whole table for each key (TestClaimReadsHeadsFromTheirIndex);
//  4. with PerKey > 1, the runs: after each PENDING head, its key's
//     PENDING rows before the first FAILED one (or DEAD, under the hold
//     policy), a range of ferry_inbox_head_idx each, all in one statement;
//  5. the claims written on their keys in one statement, and what every
//     other key is left saying in one more;
//  6. the claimed rows read back. A head whose attempts are spent is made
//     DEAD instead, its row locked with SKIP LOCKED (a row another
//     transaction holds waits a moment).
//
// A claim locks keys, then (SKIP LOCKED) rows; every other writer locks
// rows, then keys: a claim never waits, so no cycle of waits includes it.

// noHead is a position no row has.
const noHead = int64(1<<63 - 1)

// heldHeadPause is how long a key waits whose head another transaction
// held when a claim wanted to give it up.
const heldHeadPause = 50 * time.Millisecond

// sqlClaimHeads reads the heads of keys of group (its arguments: group,
// group, then the keys, an IN list of marks: claimHeadsQuery), with the
// group's policy and the server's time: each key's first pending, failed
// and (under the hold policy) dead row, each the first entry of a range of
// ferry_inbox_head_idx, the least of them its head and the least of the
// last two the first row a run stops at.
const sqlClaimHeads = `
SELECT h.k, h.hold, ` + sqlNow + `, i.pos, i.event_id, i.state, i.attempts, i.next_attempt_at, h.blocker
  FROM (SELECT f.group_name, f.k, f.hold, LEAST(f.p, f.f, f.d) AS head, LEAST(f.f, f.d) AS blocker
          FROM (SELECT kk.group_name, kk.k, pol.hold,
                       COALESCE((SELECT x.pos FROM ferry_inbox x FORCE INDEX (ferry_inbox_head_idx)
                                  WHERE x.group_name = kk.group_name AND x.k = kk.k AND x.state = 'pending' ORDER BY x.pos LIMIT 1), ` + noHeadSQL + `) AS p,
                       COALESCE((SELECT x.pos FROM ferry_inbox x FORCE INDEX (ferry_inbox_head_idx)
                                  WHERE x.group_name = kk.group_name AND x.k = kk.k AND x.state = 'failed' ORDER BY x.pos LIMIT 1), ` + noHeadSQL + `) AS f,
                       IF(pol.hold, COALESCE((SELECT x.pos FROM ferry_inbox x FORCE INDEX (ferry_inbox_head_idx)
                                  WHERE x.group_name = kk.group_name AND x.k = kk.k AND x.state = 'dead' ORDER BY x.pos LIMIT 1), ` + noHeadSQL + `), ` + noHeadSQL + `) AS d
                  FROM ferry_inbox_keys kk
                 CROSS JOIN (SELECT ` + holdPolicy + ` AS hold) pol
                 WHERE kk.group_name = ? AND kk.k IN ({keys})
                 LIMIT 1000000) f) h
  LEFT JOIN ferry_inbox i ON i.pos = h.head`

// claimHeadsQuery is sqlClaimHeads for n keys.
func claimHeadsQuery(n int) string { return strings.Replace(sqlClaimHeads, "{keys}", marks(n), 1) }

// noHeadSQL is noHead as SQL text.
const noHeadSQL = "9223372036854775807"

// dueKey is a key a claim locked, with its claim (an expired one, for a
// rescue).
type dueKey struct {
	key           string
	claimed       bool
	from, through int64
	suspects      int64
	head          *claimHead
	run           []inboxmodel.Queued // the rows to claim, the head first
}

// claimHead is a key's head as a claim read it.
type claimHead struct {
	key  string
	hold bool
	now  int64
	pos  int64 // 0: no head
	id   uuid.UUID
	row  inboxmodel.Queued
	// blocker is the position of the key's first FAILED row (or DEAD,
	// under the hold policy): a run that starts at a PENDING head ends
	// before it.
	blocker int64
}

// keyOutcome is what a claim leaves a key's row saying that it did not
// claim: when an ordinary claim may take it, when a rescue may, or which
// DEAD row holds it.
type keyOutcome struct {
	runnable, rescue sql.NullInt64
	held             []byte
	suspects         int64
}

// ClaimInbox implements ferrydriver.Inbox.
func (d *Driver) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	op := "claim inbox rows of group " + p.Group
	var out []*ferrydriver.InboxRow
	err := d.writeRC(ctx, op, func(tx *sql.Tx) error {
		var err error
		out, err = d.claimTx(ctx, tx, p)
		if err != nil {
			return d.wrapErr(op, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// claimKeys locks the keys a claim looks at (step 1).
func claimKeys(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams) ([]*dueKey, error) {
	q := `SELECT k, FALSE, 0, 0, suspect_through FROM ferry_inbox_keys
 WHERE group_name = ? AND runnable_at <= ` + sqlNow + ` AND claim_token IS NULL ORDER BY runnable_at LIMIT ? FOR UPDATE SKIP LOCKED`
	limit := inboxmodel.ClaimLimit(inboxmodel.ClaimParams{Limit: p.Limit, Keys: p.Keys})
	if p.Rescue {
		q = `SELECT k, claim_token IS NOT NULL, COALESCE(claim_from, 0), COALESCE(claim_through, 0), suspect_through FROM ferry_inbox_keys
 WHERE group_name = ? AND rescue_at <= ` + sqlNow + ` ORDER BY rescue_at LIMIT ? FOR UPDATE SKIP LOCKED`
		limit = max(p.Limit, 1)
	}
	rows, err := tx.QueryContext(ctx, q, p.Group, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []*dueKey
	for rows.Next() {
		k := &dueKey{}
		var key []byte
		if err := rows.Scan(&key, &k.claimed, &k.from, &k.through, &k.suspects); err != nil {
			return nil, err
		}
		k.key = string(key)
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// chargeExpired counts an attempt for every unfinished row that the
// expired claims of keys covered (step 2): its process crashed, or its
// handler outlived the claim, while it ran them. A rescue holds the keys'
// rows already, so it must not wait for an inbox row (the lock order is
// rows, then keys): a row another transaction holds (a retraction, a late
// finish of the expired claim, both of which wait for the key) is left
// uncharged.
func chargeExpired(ctx context.Context, tx *sql.Tx, group string, keys []*dueKey) error {
	var q []string
	var args []any
	for _, k := range keys {
		if k.claimed {
			q = append(q, `(k = ? AND pos > ? AND pos <= ?)`)
			args = append(args, k.key, k.from, k.through)
			k.suspects = max(k.suspects, k.through)
		}
	}
	if len(q) == 0 {
		return nil
	}
	rows, err := tx.QueryContext(ctx, `SELECT pos FROM ferry_inbox FORCE INDEX (ferry_inbox_head_idx)
 WHERE group_name = ? AND state IN ('pending', 'failed') AND (`+strings.Join(q, " OR ")+`) FOR UPDATE SKIP LOCKED`, append([]any{group}, args...)...)
	if err != nil {
		return err
	}
	positions, err := scanPositions(rows)
	if err != nil || len(positions) == 0 {
		return err
	}
	_, err = tx.ExecContext(ctx, `UPDATE ferry_inbox SET attempts = attempts + 1 WHERE pos IN (`+marks(len(positions))+`)`, positions...)
	return err
}

func scanPositions(rows *sql.Rows) ([]any, error) {
	defer rows.Close()
	var out []any
	for rows.Next() {
		var pos int64
		if err := rows.Scan(&pos); err != nil {
			return nil, err
		}
		out = append(out, pos)
	}
	return out, rows.Err()
}

// claimHeads reads the locked keys' heads (step 3).
func claimHeads(ctx context.Context, tx *sql.Tx, group string, keys []string) (map[string]*claimHead, error) {
	args := []any{group, group}
	for _, k := range keys {
		args = append(args, k)
	}
	rows, err := tx.QueryContext(ctx, claimHeadsQuery(len(keys)), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]*claimHead, len(keys))
	for rows.Next() {
		h := &claimHead{}
		var key, id []byte
		var pos, attempts, next sql.NullInt64
		var state sql.NullString
		if err := rows.Scan(&key, &h.hold, &h.now, &pos, &id, &state, &attempts, &next, &h.blocker); err != nil {
			return nil, err
		}
		h.key = string(key)
		if pos.Valid {
			u, err := uuid.FromBytes(id)
			if err != nil {
				return nil, err
			}
			h.pos, h.id = pos.Int64, u
			h.row = inboxmodel.Queued{State: ferrydriver.InboxState(state.String), Pos: pos.Int64, Attempts: int(attempts.Int64), RetryAt: fromMicros(next.Int64)}
		}
		out[h.key] = h
	}
	return out, rows.Err()
}

// queue is the head as inboxmodel reads a key's queue: none, or the head.
func (h *claimHead) queue() []inboxmodel.Queued {
	if h == nil || h.pos == 0 {
		return nil
	}
	return []inboxmodel.Queued{h.row}
}

// claimRuns reads, for each of heads (PENDING), up to n PENDING rows of
// its key after it and before its blocker, in order (step 4): one range of
// ferry_inbox_head_idx each, in one statement. They are not locked: a
// claim writes nothing of them.
func claimRuns(ctx context.Context, tx *sql.Tx, group string, heads []*claimHead, n int) (map[string][]inboxmodel.Queued, error) {
	out := map[string][]inboxmodel.Queued{}
	if len(heads) == 0 || n <= 0 {
		return out, nil
	}
	q, args := claimRunsQuery(group, heads, n)
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k []byte
		r := inboxmodel.Queued{State: ferrydriver.InboxPending}
		if err := rows.Scan(&k, &r.Pos, &r.Attempts); err != nil {
			return nil, err
		}
		out[string(k)] = append(out[string(k)], r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, rs := range out {
		// UNION ALL keeps no order across its parts; each key's is sorted.
		slices.SortFunc(rs, func(a, b inboxmodel.Queued) int { return cmp.Compare(a.Pos, b.Pos) })
	}
	return out, nil
}

// claimRunsQuery is claimRuns' statement and arguments.
func claimRunsQuery(group string, heads []*claimHead, n int) (string, []any) {
	var q strings.Builder
	var args []any
	for i, h := range heads {
		if i > 0 {
			q.WriteString(" UNION ALL ")
		}
		q.WriteString(`(SELECT k, pos, attempts FROM ferry_inbox FORCE INDEX (ferry_inbox_head_idx)
 WHERE group_name = ? AND k = ? AND state = 'pending' AND pos > ? AND pos < ? ORDER BY pos LIMIT ?)`)
		args = append(args, group, h.key, h.pos, h.blocker, n)
	}
	return q.String(), args
}

func (d *Driver) claimTx(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	keys, err := claimKeys(ctx, tx, p)
	if err != nil || len(keys) == 0 {
		return nil, err
	}
	return d.claimDue(ctx, tx, p, keys, nil)
}

// claimDue claims of keys (locked by this transaction) what p allows,
// steps 2 to 6; with ours, only keys whose head is one of ours (an
// ingest's rows), the others left as they are.
func (d *Driver) claimDue(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams, keys []*dueKey, ours map[uuid.UUID]bool) ([]*ferrydriver.InboxRow, error) {
	if p.Rescue {
		if err := chargeExpired(ctx, tx, p.Group, keys); err != nil {
			return nil, err
		}
	}
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.key
	}
	heads, err := claimHeads(ctx, tx, p.Group, names)
	if err != nil {
		return nil, err
	}
	limit := max(p.Limit, 1)
	var runs map[string][]inboxmodel.Queued
	if n := min(max(p.PerKey, 1)-1, limit-1); n > 0 && !p.Rescue {
		var from []*claimHead
		for _, k := range keys {
			if h := heads[k.key]; h != nil && h.pos != 0 && h.row.State == ferrydriver.InboxPending && (ours == nil || ours[h.id] && len(from) < p.Keys) {
				from = append(from, h)
			}
		}
		if runs, err = claimRuns(ctx, tx, p.Group, from, n); err != nil {
			return nil, err
		}
	}
	outcomes := map[string]keyOutcome{}
	var claimed, spent []*dueKey
	room := limit
	for _, k := range keys {
		h := heads[k.key]
		if ours != nil && (h == nil || h.pos == 0 || !ours[h.id] || len(claimed) == p.Keys) {
			continue
		}
		if room <= 0 {
			if k.claimed {
				// An expired claim this rescue had no room for: its rows
				// were charged, and are suspect now.
				outcomes[k.key] = keyOutcome{rescue: sql.NullInt64{Int64: h.now, Valid: true}, suspects: k.suspects}
			}
			continue
		}
		q := h.queue()
		var act inboxmodel.Action
		var take []int
		now := fromMicros(h.now)
		if p.Rescue {
			act, k.suspects = inboxmodel.RescueKey(q, k.suspects, now, p.MaxAttempts)
			take = []int{0}
		} else {
			n := 1
			if p.PerKey > 1 {
				n = min(p.PerKey, room)
				q = append(q, runs[k.key]...)
			}
			act, take = inboxmodel.ClaimKey(q, k.suspects, h.hold, n, now, p.MaxAttempts)
		}
		switch act {
		case inboxmodel.ClaimRows:
			k.head = h
			for _, i := range take {
				k.run = append(k.run, q[i])
			}
			claimed = append(claimed, k)
			room -= len(k.run)
		case inboxmodel.GiveUp:
			k.head = h
			spent = append(spent, k)
			room--
		default:
			outcomes[k.key] = next(h, k.suspects)
		}
	}
	token := uuid.New()
	out, err := d.writeClaims(ctx, tx, p, claimed, token)
	if err != nil {
		return nil, err
	}
	dead, err := giveUp(ctx, tx, p.Group, spent, outcomes)
	if err != nil {
		return nil, err
	}
	out = append(out, dead...)
	return out, setKeyOutcomes(ctx, tx, p.Group, names, outcomes)
}

// next is what a key that nothing was claimed of is left saying
// (inboxmodel.NextUnclaimed), at the server's time.
func next(h *claimHead, suspects int64) keyOutcome {
	runnable, rescue, held := inboxmodel.NextUnclaimed(h.queue(), suspects, fromMicros(h.now))
	o := keyOutcome{suspects: suspects}
	switch {
	case held:
		o.held = h.id[:]
	case !rescue.IsZero():
		o.rescue = sql.NullInt64{Int64: micros(rescue), Valid: true}
	case !runnable.IsZero():
		o.runnable = sql.NullInt64{Int64: micros(runnable), Valid: true}
	}
	return o
}

// writeClaims records the claims on their keys, in one statement, and
// reads their rows back, PROCESSING, their attempt counted, key by key in
// order (step 5).
func (d *Driver) writeClaims(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams, claimed []*dueKey, token uuid.UUID) ([]*ferrydriver.InboxRow, error) {
	if len(claimed) == 0 {
		return nil, nil
	}
	var from, through, suspects strings.Builder
	var fArgs, tArgs, sArgs, kArgs, positions []any
	expires := claimed[0].head.now + p.TTL.Microseconds()
	for _, k := range claimed {
		first, last := k.run[0].Pos, k.run[len(k.run)-1].Pos
		from.WriteString(" WHEN ? THEN ?")
		through.WriteString(" WHEN ? THEN ?")
		suspects.WriteString(" WHEN ? THEN ?")
		fArgs, tArgs, sArgs, kArgs = append(fArgs, k.key, first-1), append(tArgs, k.key, last), append(sArgs, k.key, k.suspects), append(kArgs, k.key)
		for _, r := range k.run {
			positions = append(positions, r.Pos)
		}
	}
	args := append([]any{token[:], p.Worker, expires, expires}, fArgs...)
	args = append(append(append(append(args, tArgs...), sArgs...), p.Group), kArgs...)
	if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY)
   SET claim_token = ?, claimed_by = ?, claim_expires_at = ?, rescue_at = ?, runnable_at = NULL, held_by = NULL,
       claim_from = CASE k`+from.String()+` END, claim_through = CASE k`+through.String()+` END,
       suspect_through = CASE k`+suspects.String()+` END
 WHERE group_name = ? AND k IN (`+marks(len(kArgs))+`)`, args...); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+rowColumns+`, TRUE, i.pos FROM ferry_inbox i WHERE i.pos IN (`+marks(len(positions))+`)`, positions...)
	if err != nil {
		return nil, err
	}
	byPos := map[int64]*ferrydriver.InboxRow{}
	for rows.Next() {
		var pos int64
		row, err := scanInboxRow(rows, p.Group, &pos)
		if err != nil {
			rows.Close()
			return nil, err
		}
		byPos[pos] = row
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []*ferrydriver.InboxRow
	for _, pos := range positions {
		// Inside the claim this transaction wrote: PROCESSING.
		if row := byPos[pos.(int64)]; row != nil {
			row.Claim = claimString(token, pos.(int64))
			out = append(out, row)
		}
	}
	return out, nil
}

// giveUp makes the spent heads DEAD, their attempts exhausted, each row
// locked with SKIP LOCKED (a head another transaction holds, a retraction
// or a stale attempt's finish, waits a moment), and records what their
// keys are left saying: held, or due at once (for a rescue while rows
// after it are suspect), by the group's policy.
func giveUp(ctx context.Context, tx *sql.Tx, group string, spent []*dueKey, outcomes map[string]keyOutcome) ([]*ferrydriver.InboxRow, error) {
	if len(spent) == 0 {
		return nil, nil
	}
	positions := make([]any, len(spent))
	for i, k := range spent {
		positions[i] = k.head.pos
	}
	rows, err := tx.QueryContext(ctx, `SELECT pos FROM ferry_inbox WHERE pos IN (`+marks(len(positions))+`) AND state IN ('pending', 'failed') FOR UPDATE SKIP LOCKED`, positions...)
	if err != nil {
		return nil, err
	}
	locked, err := scanPositions(rows)
	if err != nil {
		return nil, err
	}
	var dead []any
	for _, k := range spent {
		h := k.head
		if !slices.Contains(locked, any(h.pos)) {
			outcomes[k.key] = keyOutcome{runnable: sql.NullInt64{Int64: h.now + heldHeadPause.Microseconds(), Valid: true}, suspects: k.suspects}
			continue
		}
		dead = append(dead, h.pos)
		now := sql.NullInt64{Int64: h.now, Valid: true}
		switch {
		case h.hold:
			outcomes[k.key] = keyOutcome{held: h.id[:], suspects: k.suspects}
		case k.suspects > h.pos:
			outcomes[k.key] = keyOutcome{rescue: now, suspects: k.suspects} // the next suspect row, alone
		default:
			outcomes[k.key] = keyOutcome{runnable: now, suspects: k.suspects}
		}
	}
	if len(dead) == 0 {
		return nil, nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox
   SET attempt_log = `+logAttempt("attempts", "'dead'", "?")+`,
       last_error = CONCAT(?, IF(COALESCE(last_error, '') = '', '', CONCAT(' (last recorded error: ', last_error, ')'))),
       state = 'dead', finished_at = `+sqlNow+`
 WHERE pos IN (`+marks(len(dead))+`)`, append([]any{ferrydriver.ReasonAttemptsExhausted, ferrydriver.ReasonAttemptsExhausted}, dead...)...); err != nil {
		return nil, err
	}
	rows, err = tx.QueryContext(ctx, `SELECT `+rowColumns+`, FALSE FROM ferry_inbox i WHERE i.pos IN (`+marks(len(dead))+`) ORDER BY i.pos`, dead...)
	if err != nil {
		return nil, err
	}
	return scanInboxRows(rows, group)
}

// setKeyOutcomes writes what the claim decided of each key it did not
// claim, in one statement: the keys it gave up a head of, and those with
// nothing to run now.
func setKeyOutcomes(ctx context.Context, tx *sql.Tx, group string, keys []string, outcomes map[string]keyOutcome) error {
	if len(outcomes) == 0 {
		return nil
	}
	var runnable, rescue, held, suspects strings.Builder
	var rArgs, cArgs, hArgs, sArgs, kArgs []any
	for _, k := range keys {
		o, ok := outcomes[k]
		if !ok {
			continue
		}
		for _, b := range []*strings.Builder{&runnable, &rescue, &held, &suspects} {
			b.WriteString(" WHEN ? THEN ?")
		}
		var r, c, h any
		if o.runnable.Valid {
			r = o.runnable.Int64
		}
		if o.rescue.Valid {
			c = o.rescue.Int64
		}
		if o.held != nil {
			h = o.held
		}
		rArgs, cArgs, hArgs, sArgs = append(rArgs, k, r), append(cArgs, k, c), append(hArgs, k, h), append(sArgs, k, o.suspects)
		kArgs = append(kArgs, k)
	}
	args := append(append(append(append(append(rArgs, cArgs...), hArgs...), sArgs...), group), kArgs...)
	_, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY)
   SET runnable_at = CASE k`+runnable.String()+` END, rescue_at = CASE k`+rescue.String()+` END,
       held_by = CASE k`+held.String()+` END, suspect_through = CASE k`+suspects.String()+` END, `+noClaim+`
 WHERE group_name = ? AND k IN (`+marks(len(kArgs))+`)`, args...)
	return err
}

// lockedRow is an inbox row as lockRows read it.
type lockedRow struct {
	state ferrydriver.InboxState
	key   string
	pos   int64
}

// lockRows locks group's rows of the events ids (sorted: the unique
// index's order, as every writer of several rows locks them), and returns
// them by event. @@in_transaction fences a transaction that InnoDB already
// rolled back (a deadlock the caller did not see): it finds no row.
func lockRows(ctx context.Context, tx *sql.Tx, group string, ids []uuid.UUID) (map[uuid.UUID]lockedRow, error) {
	ids = slices.Clone(ids)
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return strings.Compare(string(a[:]), string(b[:])) })
	ids = slices.Compact(ids)
	out := map[uuid.UUID]lockedRow{}
	err := chunks(ids, inListChunk, func(ids []uuid.UUID) error {
		rows, err := tx.QueryContext(ctx, `SELECT event_id, state, k, pos FROM ferry_inbox FORCE INDEX (ferry_inbox_event_idx)
 WHERE group_name = ? AND event_id IN (`+marks(len(ids))+`) AND @@in_transaction = 1 ORDER BY event_id FOR UPDATE`, idArgs([]any{group}, ids)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, k []byte
			var st string
			var r lockedRow
			if err := rows.Scan(&id, &st, &k, &r.pos); err != nil {
				return err
			}
			u, err := uuid.FromBytes(id)
			if err != nil {
				return err
			}
			r.state, r.key = ferrydriver.InboxState(st), string(k)
			out[u] = r
		}
		return rows.Err()
	})
	return out, err
}

// keyClaim is a key's claim: its token and the range of positions it
// covers.
type keyClaim struct {
	token         []byte
	from, through int64
}

// covers says whether the claim covers r: a PENDING or FAILED row inside
// its range.
func (c keyClaim) covers(r lockedRow) bool {
	return (r.state == ferrydriver.InboxPending || r.state == ferrydriver.InboxFailed) && r.pos > c.from && r.pos <= c.through
}

// keyClaims reads the claims of keys of group: with live, the unexpired
// ones, locked in key order (the keys are locked after their rows);
// otherwise every claim, expired ones included, in a plain read.
func keyClaims(ctx context.Context, q querier, group string, keys []string, live bool) (map[string]keyClaim, error) {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	cond := ``
	if live {
		cond = ` AND claim_expires_at > ` + sqlNow + ` ORDER BY k FOR UPDATE`
	}
	out := map[string]keyClaim{}
	err := chunks(keys, inListChunk, func(keys []string) error {
		args := []any{group}
		for _, k := range keys {
			args = append(args, k)
		}
		rows, err := q.QueryContext(ctx, `SELECT k, claim_token, claim_from, claim_through FROM ferry_inbox_keys FORCE INDEX (PRIMARY)
 WHERE group_name = ? AND k IN (`+marks(len(keys))+`) AND claim_token IS NOT NULL`+cond, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k []byte
			var c keyClaim
			if err := rows.Scan(&k, &c.token, &c.from, &c.through); err != nil {
				return err
			}
			out[string(k)] = c
		}
		return rows.Err()
	})
	return out, err
}
