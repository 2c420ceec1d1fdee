package ferrymysql

import (
	"cmp"
	"context"
	"database/sql"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
)

// A claim is one READ COMMITTED transaction of a few statements, whatever
// it claims:
//
//  1. the due keys, locked with FOR UPDATE SKIP LOCKED on
//     ferry_inbox_keys_runnable_idx, oldest due first (a rescue: the keys
//     of rows whose claims expired, locked the same way by primary key);
//  2. each key's head, read afresh (no lock): the least position of its
//     oldest pending, failed and processing rows (and dead ones, under the
//     hold policy), each the first entry of a range of
//     ferry_inbox_head_idx, and whether another of its rows runs (a
//     range of the same index); the index is forced: on a table whose
//     statistics predate its rows (a backlog just ingested) the optimizer
//     picked plans that read the whole table for each key (20,000 rows a
//     claim in ferry bench consume, TestClaimReadsHeadsFromTheirIndex);
//  3. with PerKey > 1, the runs: after each PENDING head, its key's
//     PENDING rows before the first FAILED or PROCESSING one (or DEAD,
//     under the hold policy), a range of ferry_inbox_head_idx each, all
//     in one statement (no lock);
//  4. the heads and runs to claim, locked with FOR UPDATE SKIP LOCKED by
//     primary key and checked again (a row a finisher or a retraction
//     holds is left to the next claim, and a run ends before it; a claim
//     never waits, so no cycle of waits includes it);
//  5. the claimed rows made PROCESSING with the claim's token (or DEAD,
//     when a head's attempts are spent), read back whole;
//  6. each key's next due time (its claim's expiry, its head's retry, none)
//     in one statement.

// noHead is a position no row has.
const noHead = int64(1<<63 - 1)

// heldHeadPause is how long a key waits whose head another transaction
// held when a claim wanted it.
const heldHeadPause = 50 * time.Millisecond

// sqlClaimHeads reads the heads of keys of group (its arguments: group,
// group, group, the keys; {keys} is their marks), with the group's policy
// and the server's time.
const sqlClaimHeads = `
SELECT h.k, h.hold, ` + sqlNow + `, i.pos, i.event_id, i.state, i.attempts, i.next_attempt_at, i.claim_expires_at,
       (SELECT MAX(b.claim_expires_at) FROM ferry_inbox b FORCE INDEX (ferry_inbox_head_idx)
         WHERE b.group_name = h.group_name AND b.k = h.k AND b.state = 'processing' AND b.pos <> h.head AND b.claim_expires_at > ` + sqlNow + `),
       EXISTS (SELECT 1 FROM ferry_inbox b FORCE INDEX (ferry_inbox_head_idx)
         WHERE b.group_name = h.group_name AND b.k = h.k AND b.state = 'processing' AND b.pos <> h.head AND b.claim_expires_at <= ` + sqlNow + `),
       h.blocker
  FROM (SELECT f.group_name, f.k, f.hold, LEAST(f.p, f.f, f.r, f.d) AS head, LEAST(f.f, f.r, f.d) AS blocker
          FROM (SELECT kk.group_name, kk.k, pol.hold, {first:pending} AS p, {first:failed} AS f, {first:processing} AS r,
                       IF(pol.hold, {first:dead}, {none}) AS d
                  FROM ferry_inbox_keys kk
                 CROSS JOIN (SELECT ` + holdPolicy + ` AS hold) pol
                 WHERE kk.group_name = ? AND kk.k IN ({keys})
                 LIMIT 1000000) f) h
  LEFT JOIN ferry_inbox i ON i.pos = h.head`

var claimHeadsReplacer = func() *strings.Replacer {
	var pairs []string
	for _, st := range []string{"pending", "failed", "processing", "dead"} {
		pairs = append(pairs, "{first:"+st+"}",
			`COALESCE((SELECT x.pos FROM ferry_inbox x FORCE INDEX (ferry_inbox_head_idx) WHERE x.group_name = kk.group_name AND x.k = kk.k AND x.state = '`+st+`' ORDER BY x.pos LIMIT 1), {none})`)
	}
	return strings.NewReplacer(pairs...)
}()

// claimHead is a key's head as a claim read it.
type claimHead struct {
	key         string
	hold        bool
	now         int64
	pos         int64 // 0: no head
	id          uuid.UUID
	state       ferrydriver.InboxState
	attempts    int
	nextAttempt int64
	expires     sql.NullInt64
	busyUntil   sql.NullInt64 // another row of the key runs until then
	// stale: another row of the key is PROCESSING under a claim that
	// expired (a row redriven ahead of it is the head): the key waits for
	// a rescue, which takes the head.
	stale bool
	// blocker is the position of the key's first FAILED or PROCESSING row
	// (or DEAD, under the hold policy): a run that starts at a PENDING
	// head ends before it.
	blocker int64
}

// keyOutcome is what a claim leaves a key's row saying.
type keyOutcome struct {
	runnable sql.NullInt64
	held     []byte
}

// ClaimInbox implements ferrydriver.Inbox: of each key, its head, and with
// p.PerKey > 1 a run of the PENDING rows after a PENDING head (see
// runs.go).
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

// claimLimit is how many heads a claim takes: one per key, so as many as
// both Limit and Keys allow.
func claimLimit(p *ferrydriver.ClaimInboxParams) int {
	n := max(p.Limit, 1)
	if p.Keys > 0 {
		n = min(n, p.Keys)
	}
	return n
}

func scanKeys(rows *sql.Rows) ([]string, error) {
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, string(k))
	}
	return keys, rows.Err()
}

// claimKeys locks the keys a claim looks at (step 1).
func (d *Driver) claimKeys(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams) ([]string, error) {
	if !p.Rescue {
		rows, err := tx.QueryContext(ctx, `SELECT k FROM ferry_inbox_keys WHERE group_name = ? AND runnable_at <= `+sqlNow+`
 ORDER BY runnable_at LIMIT ? FOR UPDATE SKIP LOCKED`, p.Group, claimLimit(p))
		if err != nil {
			return nil, err
		}
		return scanKeys(rows)
	}
	// A run's rows share the claim's expiry: a key once.
	rows, err := tx.QueryContext(ctx, `SELECT k FROM ferry_inbox WHERE group_name = ? AND state = 'processing' AND claim_expires_at <= `+sqlNow+`
 GROUP BY k ORDER BY MIN(claim_expires_at) LIMIT ?`, p.Group, claimLimit(p))
	if err != nil {
		return nil, err
	}
	expired, err := scanKeys(rows)
	if err != nil || len(expired) == 0 {
		return nil, err
	}
	args := []any{p.Group}
	seen := map[string]bool{}
	for _, k := range expired {
		if !seen[k] {
			seen[k] = true
			args = append(args, k)
		}
	}
	rows, err = tx.QueryContext(ctx, `SELECT k FROM ferry_inbox_keys FORCE INDEX (PRIMARY) WHERE group_name = ? AND k IN (`+marks(len(args)-1)+`) FOR UPDATE SKIP LOCKED`, args...)
	if err != nil {
		return nil, err
	}
	return scanKeys(rows)
}

// claimHeads reads the locked keys' heads (step 2).
func claimHeads(ctx context.Context, tx *sql.Tx, group string, keys []string) (map[string]*claimHead, error) {
	q := strings.NewReplacer("{none}", strconv.FormatInt(noHead, 10), "{keys}", marks(len(keys))).Replace(claimHeadsReplacer.Replace(sqlClaimHeads))
	args := []any{group, group}
	for _, k := range keys {
		args = append(args, k)
	}
	rows, err := tx.QueryContext(ctx, q, args...)
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
		if err := rows.Scan(&key, &h.hold, &h.now, &pos, &id, &state, &attempts, &next, &h.expires, &h.busyUntil, &h.stale, &h.blocker); err != nil {
			return nil, err
		}
		h.key = string(key)
		if pos.Valid {
			u, err := uuid.FromBytes(id)
			if err != nil {
				return nil, err
			}
			h.pos, h.id, h.state, h.attempts, h.nextAttempt = pos.Int64, u, ferrydriver.InboxState(state.String), int(attempts.Int64), next.Int64
		}
		out[h.key] = h
	}
	return out, rows.Err()
}

// lockHeads locks the rows at positions with FOR UPDATE SKIP LOCKED and
// returns their states now (step 3): a row another transaction holds is
// absent.
func lockHeads(ctx context.Context, tx *sql.Tx, positions []any) (map[int64]ferrydriver.InboxState, error) {
	out := map[int64]ferrydriver.InboxState{}
	if len(positions) == 0 {
		return out, nil
	}
	rows, err := tx.QueryContext(ctx, `SELECT pos, state FROM ferry_inbox WHERE pos IN (`+marks(len(positions))+`) FOR UPDATE SKIP LOCKED`, positions...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var pos int64
		var state string
		if err := rows.Scan(&pos, &state); err != nil {
			return nil, err
		}
		out[pos] = ferrydriver.InboxState(state)
	}
	return out, rows.Err()
}

// runRow is a row of a run as claimRuns read it.
type runRow struct {
	pos      int64
	attempts int
}

// claimRuns reads, for each of heads (PENDING), up to n PENDING rows of
// its key after it and before its blocker, in order: one range of
// ferry_inbox_head_idx each, in one statement. They are not locked yet.
func claimRuns(ctx context.Context, tx *sql.Tx, group string, heads []*claimHead, n int) (map[string][]runRow, error) {
	out := map[string][]runRow{}
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
		var r runRow
		if err := rows.Scan(&k, &r.pos, &r.attempts); err != nil {
			return nil, err
		}
		out[string(k)] = append(out[string(k)], r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, rs := range out {
		// UNION ALL keeps no order across its parts; each key's is sorted.
		slices.SortFunc(rs, func(a, b runRow) int { return cmp.Compare(a.pos, b.pos) })
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
	keys, err := d.claimKeys(ctx, tx, p)
	if err != nil || len(keys) == 0 {
		return nil, err
	}
	heads, err := claimHeads(ctx, tx, p.Group, keys)
	if err != nil {
		return nil, err
	}
	outcomes, want := decideKeys(keys, heads, p.Rescue)
	// Runs: the PENDING rows after each PENDING head, read here.
	limit := max(p.Limit, 1)
	var runs map[string][]runRow
	if n := min(max(p.PerKey, 1)-1, limit-1); n > 0 && !p.Rescue {
		var from []*claimHead
		for _, k := range want {
			if h := heads[k]; h.state == ferrydriver.InboxPending {
				from = append(from, h)
			}
		}
		if runs, err = claimRuns(ctx, tx, p.Group, from, n); err != nil {
			return nil, err
		}
	}
	plans, lock := planClaim(want, heads, runs, limit)
	locked, err := lockHeads(ctx, tx, lock)
	if err != nil {
		return nil, err
	}
	c := takePlans(p, plans, locked, outcomes)
	out, err := c.write(ctx, tx, p)
	if err != nil {
		return nil, err
	}
	return out, setKeyOutcomes(ctx, tx, p.Group, keys, outcomes)
}

// view is the head as inboxmodel.Decide reads it.
func (h *claimHead) view() inboxmodel.KeyHead {
	if h.pos == 0 {
		return inboxmodel.KeyHead{}
	}
	v := inboxmodel.KeyHead{State: h.state, RetryAt: time.UnixMicro(h.nextAttempt), Stale: h.stale}
	if h.expires.Valid {
		v.ClaimExpires = time.UnixMicro(h.expires.Int64)
	}
	if h.busyUntil.Valid {
		v.BusyUntil = time.UnixMicro(h.busyUntil.Int64)
	}
	return v
}

// next is what a key whose head cannot run now is left saying
// (inboxmodel.Schedule): when it may, or which DEAD row holds it.
func (h *claimHead) next() keyOutcome {
	at, held := inboxmodel.Schedule(h.view(), time.UnixMicro(h.now))
	switch {
	case held:
		return keyOutcome{held: h.id[:]}
	case at.IsZero():
		return keyOutcome{} // nothing to run
	}
	return keyOutcome{runnable: sql.NullInt64{Int64: at.UnixMicro(), Valid: true}}
}

// decideKeys applies the rule of a key's head (inboxmodel.Decide, at the
// server's time) to each key read: it returns the keys whose heads the
// claim takes (or gives up, their attempts spent), in key order, and what
// the claim leaves each other key saying.
func decideKeys(keys []string, heads map[string]*claimHead, rescue bool) (map[string]keyOutcome, []string) {
	outcomes := map[string]keyOutcome{}
	var want []string
	for _, k := range keys {
		h := heads[k]
		if h == nil {
			continue
		}
		switch inboxmodel.Decide(h.view(), time.UnixMicro(h.now), rescue) {
		case inboxmodel.Take:
			want = append(want, k)
		case inboxmodel.Wait:
			outcomes[k] = h.next()
		case inboxmodel.LeaveToRescue:
			// To the back for a second, so that it cannot crowd out the
			// others.
			outcomes[k] = keyOutcome{runnable: sql.NullInt64{Int64: h.now + time.Second.Microseconds(), Valid: true}}
		case inboxmodel.LeaveToClaim:
		}
	}
	return outcomes, want
}

// plan is what a claim means to take of one key: its head, then its run.
type plan struct {
	h   *claimHead
	run []runRow
}

// planClaim plans a claim key by key, the head then its run, until the
// claim's limit; the keys left over stay due for the next claim. It
// returns the plans and the positions to lock (only the planned rows).
func planClaim(want []string, heads map[string]*claimHead, runs map[string][]runRow, limit int) ([]plan, []any) {
	var plans []plan
	var lock []any
	for _, k := range want {
		if len(lock) >= limit {
			break
		}
		pl := plan{h: heads[k]}
		lock = append(lock, pl.h.pos)
		for _, r := range runs[k] {
			if len(lock) >= limit {
				break
			}
			pl.run = append(pl.run, r)
			lock = append(lock, r.pos)
		}
		plans = append(plans, pl)
	}
	return plans, lock
}

// taken is what a claim takes of its plans once their rows are locked.
type taken struct {
	token   uuid.UUID // one per call: each row is claimed once in it
	claimed []any     // positions made PROCESSING
	dead    []any     // heads whose attempts are spent
	order   []int64   // the rows returned, in order
	more    map[int64]bool
	expires int64
}

// takePlans takes, of each plan, the head still in the state it was read
// in (a head another transaction holds waits a moment), and its run while
// the run's rows are still PENDING, locked and not out of attempts; a head
// whose attempts are spent is given up under the group's policy. It
// records in outcomes what each key is left saying.
func takePlans(p *ferrydriver.ClaimInboxParams, plans []plan, locked map[int64]ferrydriver.InboxState, outcomes map[string]keyOutcome) *taken {
	c := &taken{token: uuid.New(), more: map[int64]bool{}}
	for _, pl := range plans {
		h, k := pl.h, pl.h.key
		st, ok := locked[h.pos]
		switch {
		case !ok:
			// Another transaction holds the head (a retraction, a stale
			// attempt's completion): a moment later, so that it cannot
			// crowd the claims out.
			outcomes[k] = keyOutcome{runnable: sql.NullInt64{Int64: h.now + heldHeadPause.Microseconds(), Valid: true}}
			continue
		case st != h.state:
			continue // changed since it was read: the next claim reads it again
		}
		c.expires = h.now + p.TTL.Microseconds()
		c.order = append(c.order, h.pos)
		if p.MaxAttempts > 0 && h.attempts >= p.MaxAttempts {
			// Its last attempts lost their claims: give it up, under the
			// group's policy.
			c.dead = append(c.dead, h.pos)
			if h.hold {
				outcomes[k] = keyOutcome{held: h.id[:]}
			} else {
				outcomes[k] = keyOutcome{runnable: sql.NullInt64{Int64: h.now, Valid: true}}
			}
			continue
		}
		c.claimed = append(c.claimed, h.pos)
		outcomes[k] = keyOutcome{runnable: sql.NullInt64{Int64: c.expires, Valid: true}}
		for _, r := range pl.run {
			if locked[r.pos] != ferrydriver.InboxPending || (p.MaxAttempts > 0 && r.attempts >= p.MaxAttempts) {
				break
			}
			c.more[c.claimed[len(c.claimed)-1].(int64)] = true
			c.claimed = append(c.claimed, r.pos)
			c.order = append(c.order, r.pos)
		}
	}
	return c
}

// write makes the taken rows PROCESSING under the claim's token, the
// spent heads DEAD, and reads them back, in order, each claimed row with
// its claim string (runMark when later rows of its run follow).
func (c *taken) write(ctx context.Context, tx *sql.Tx, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	if len(c.claimed) > 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox SET state = 'processing', attempts = attempts + 1, claimed_by = ?, claim_token = ?, claim_expires_at = ?
 WHERE pos IN (`+marks(len(c.claimed))+`)`, append([]any{p.Worker, c.token[:], c.expires}, c.claimed...)...); err != nil {
			return nil, err
		}
	}
	if len(c.dead) > 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox
   SET attempt_log = `+logAttempt("attempts", "'dead'", "?")+`,
       last_error = CONCAT(?, IF(COALESCE(last_error, '') = '', '', CONCAT(' (last recorded error: ', last_error, ')'))),
       state = 'dead', claimed_by = NULL, claim_token = NULL, claim_expires_at = NULL, finished_at = `+sqlNow+`
 WHERE pos IN (`+marks(len(c.dead))+`)`, append([]any{ferrydriver.ReasonAttemptsExhausted, ferrydriver.ReasonAttemptsExhausted}, c.dead...)...); err != nil {
			return nil, err
		}
	}
	if len(c.order) == 0 {
		return nil, nil
	}
	args := make([]any, len(c.order))
	for i, pos := range c.order {
		args[i] = pos
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+inboxRowColumns+`, pos FROM ferry_inbox WHERE pos IN (`+marks(len(args))+`)`, args...)
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
	for _, pos := range c.order {
		if row := byPos[pos]; row != nil {
			if row.State == ferrydriver.InboxProcessing {
				row.Claim = c.token.String()
				if c.more[pos] {
					row.Claim += runMark
				}
			}
			out = append(out, row)
		}
	}
	return out, nil
}

// setKeyOutcomes writes what the claim decided of each key (step 5), in
// one statement.
func setKeyOutcomes(ctx context.Context, tx *sql.Tx, group string, keys []string, outcomes map[string]keyOutcome) error {
	if len(outcomes) == 0 {
		return nil
	}
	var runnable, held strings.Builder
	var rArgs, hArgs, kArgs []any
	for _, k := range keys {
		o, ok := outcomes[k]
		if !ok {
			continue
		}
		runnable.WriteString(" WHEN ? THEN ?")
		held.WriteString(" WHEN ? THEN ?")
		var r any
		if o.runnable.Valid {
			r = o.runnable.Int64
		}
		var h any
		if o.held != nil {
			h = o.held
		}
		rArgs = append(rArgs, k, r)
		hArgs = append(hArgs, k, h)
		kArgs = append(kArgs, k)
	}
	args := append(append(append(rArgs, hArgs...), group), kArgs...)
	_, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY) SET runnable_at = CASE k`+runnable.String()+` END, held_by = CASE k`+held.String()+` END
 WHERE group_name = ? AND k IN (`+marks(len(kArgs))+`)`, args...)
	return err
}
