package ferrypg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// InsertInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) InsertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams) ([]bool, error) {
	res, _, err := d.insertInboxRows(ctx, p, nil)
	return res, err
}

var _ ferrydriver.InboxIngestClaimer = (*Driver[any])(nil)

// InsertInboxClaim implements ferrydriver.InboxIngestClaimer
// (sqlInboxInsertClaim).
func (d *Driver[TTx]) InsertInboxClaim(ctx context.Context, p *ferrydriver.InsertInboxParams, c *ferrydriver.IngestClaimParams) ([]bool, []*ferrydriver.InboxRow, error) {
	return d.insertInboxRows(ctx, p, c)
}

// insertInboxRows records p.Events, claiming what c allows (none: c nil).
func (d *Driver[TTx]) insertInboxRows(ctx context.Context, p *ferrydriver.InsertInboxParams, c *ferrydriver.IngestClaimParams) ([]bool, []*ferrydriver.InboxRow, error) {
	n := len(p.Events)
	res := make([]bool, n)
	if n == 0 {
		return res, nil, nil
	}
	a, err := encodeEvents(p.Events)
	if err != nil {
		return nil, nil, err
	}
	index := make(map[uuid.UUID]int, n)
	for i, id := range a.ids {
		index[id] = i
	}
	query, args := d.queries.inboxInsert, []any{p.Group, a.ids, a.keys, a.seqs, a.topics, a.types, a.sources, a.contentTypes, a.headers, a.payloads, a.created}
	token := ""
	if c != nil {
		token = uuid.NewString()
		query, args = d.queries.inboxInsertClaim, append(args, token, c.Worker, c.TTL.Milliseconds(), max(c.Keys, 0), max(c.PerKey, 1))
	}
	var mine []int // the events claimed, by key then position
	err = d.inRC(ctx, func(e executor) error {
		r, err := e.query(ctx, query, args...)
		if err != nil {
			return err
		}
		defer r.Close()
		var id uuid.UUID
		var claimed bool
		dest := []any{&id}
		if c != nil {
			dest = append(dest, &claimed)
		}
		for r.Next() {
			if err := r.Scan(dest...); err != nil {
				return err
			}
			if i, found := index[id]; found {
				res[i] = true
				if claimed {
					mine = append(mine, i)
				}
			}
		}
		return r.Err()
	})
	if err != nil {
		return nil, nil, d.wrapErr("insert into inbox of group "+p.Group, err)
	}
	if len(mine) == 0 {
		return res, nil, nil
	}
	now := time.Now()
	rows := make([]*ferrydriver.InboxRow, len(mine))
	for j, i := range mine {
		ev := *p.Events[i]
		ev.CreatedAt = ev.CreatedAt.Truncate(time.Microsecond) // as stored, and as a claim would read it
		rows[j] = &ferrydriver.InboxRow{Group: p.Group, Event: ev, State: ferrydriver.InboxProcessing, Attempts: 1, Claim: token, ReceivedAt: now}
	}
	return res, rows, nil
}

// ClaimInbox implements ferrydriver.Inbox: a claim takes runs of keys'
// rows (sqlInboxClaim); a rescue, one row of a key whose claim expired
// (rescueInbox).
func (d *Driver[TTx]) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	if p.Rescue {
		return d.rescueInbox(ctx, p)
	}
	token := uuid.NewString() // one per call: each key is claimed once in it
	perKey, keys := max(p.PerKey, 1), p.Keys
	if keys <= 0 {
		keys = p.Limit
	}
	var out, dead []*ferrydriver.InboxRow
	var idle []string
	err := d.inRC(ctx, func(e executor) error {
		out, dead, idle = out[:0], dead[:0], idle[:0]
		return e.pipeline(ctx, step{sql: d.queries.inboxClaim, args: []any{p.Group, keys, p.Worker, p.TTL.Milliseconds(),
			token, p.MaxAttempts, ferrydriver.ReasonAttemptsExhausted, perKey, p.Limit}, scan: func(r rows) error {
			var kind string
			var n int64
			row, err := scanInboxRow(r, p.Group, &kind, &n)
			if err != nil {
				return err
			}
			switch kind {
			case "claimed":
				row.Claim = token
				out = append(out, row)
			case "dead":
				dead = append(dead, row)
			default:
				idle = append(idle, row.Event.Key)
			}
			return nil
		}})
	})
	if err != nil {
		return nil, d.wrapErr("claim inbox rows of group "+p.Group, err)
	}
	out = append(out, dead...)
	if len(idle) > 0 {
		// Runnable with nothing to run (their rows were retracted, say):
		// recomputed from what has committed since.
		if err := d.inTx(ctx, func(e executor) error { return d.refreshKeys(ctx, e, p.Group, idle) }); err != nil {
			return out, err
		}
	}
	if len(dead) > 0 {
		// After the claim's commit: a waiter registered since reads the
		// row as DEAD.
		if err := d.notifyFinished(ctx, d.db, p.Group, dead); err != nil {
			return out, err
		}
	}
	return out, nil
}

// rescueInbox claims, for each of up to p.Limit keys due for a rescue, the
// key's next row alone. A key is due when its claim expired (the process
// that held it crashed, or its handler outlived the claim: every row the
// claim covered counts an attempt, and those rows are suspect) or when it
// has suspect rows left: they run one at a time, so that the one that
// crashes its process is found and spends only its own attempts. A row
// whose attempts are spent goes DEAD instead.
func (d *Driver[TTx]) rescueInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	token := uuid.NewString()
	var out, dead []*ferrydriver.InboxRow
	err := d.inTx(ctx, func(e executor) error {
		out, dead = out[:0], dead[:0]
		type due struct {
			key                           string
			expired                       bool
			from, through, done, suspects int64
		}
		var keys []due
		// Each statement goes through a pipeline, under its planner
		// settings (see plannerSettings): a rescue's plans stay on the
		// indexes whatever the statistics said.
		err := e.pipeline(ctx, step{sql: d.queries.inboxRescueKeys, args: []any{p.Group, p.Limit}, scan: func(r rows) error {
			var k due
			if err := r.Scan(&k.key, &k.expired, &k.from, &k.through, &k.done, &k.suspects); err != nil {
				return err
			}
			keys = append(keys, k)
			return nil
		}})
		if err != nil {
			return err
		}
		var refresh []string
		for _, k := range keys {
			if k.expired {
				if err := e.pipeline(ctx, step{sql: d.queries.inboxCharge, args: []any{p.Group, k.key, k.from, k.through}}); err != nil {
					return err
				}
				k.suspects = max(k.suspects, k.through)
			}
			var pos int64
			var due bool
			var head *ferrydriver.InboxRow
			err := e.pipeline(ctx, step{sql: d.queries.inboxHead, args: []any{p.Group, k.key, k.done}, scan: func(r rows) error {
				row, err := scanInboxRow(r, p.Group, &pos, &due)
				head = row
				return err
			}})
			if err != nil {
				return err
			}
			spent := head != nil && pos <= k.suspects && head.State != ferrydriver.InboxDead && (head.State == ferrydriver.InboxPending || due) &&
				p.MaxAttempts > 0 && head.Attempts >= p.MaxAttempts
			if spent {
				// Spent: DEAD, and the key goes on (or holds) by its
				// policy; unless another transaction holds the row (see
				// sqlInboxKill): the key is recomputed, and a later rescue
				// finds the row as that transaction left it.
				killed := false
				err := e.pipeline(ctx, step{sql: d.queries.inboxKill, args: []any{p.Group, head.Event.ID, ferrydriver.ReasonAttemptsExhausted}, scan: func(r rows) error {
					killed = true
					return r.Scan(&head.State, &head.Attempts, &head.LastError, &head.FinishedAt)
				}})
				if err != nil {
					return err
				}
				if killed {
					dead = append(dead, head)
					if pos >= k.suspects {
						// Nothing after it is suspect: redriven, it runs
						// as any other row, through ordinary claims.
						k.suspects = pos - 1
					}
				}
			}
			if !spent && head != nil && pos <= k.suspects && (head.State == ferrydriver.InboxPending || (head.State == ferrydriver.InboxFailed && due)) {
				if err := e.pipeline(ctx, step{sql: d.queries.inboxClaimOne, args: []any{p.Group, k.key, pos, token, p.Worker, p.TTL.Milliseconds(), k.suspects}}); err != nil {
					return err
				}
				head.State, head.Attempts, head.Claim = ferrydriver.InboxProcessing, head.Attempts+1, token
				out = append(out, head)
				continue
			}
			// The head went DEAD, or nothing of the expired claim is left
			// to run now (or the head waits for its retry, or is held): the
			// key is recomputed, through rescues while it is suspect.
			if err := e.pipeline(ctx, step{sql: d.queries.inboxUnclaim, args: []any{p.Group, k.key, k.suspects}}); err != nil {
				return err
			}
			refresh = append(refresh, k.key)
		}
		if len(refresh) > 0 {
			return d.refreshKeys(ctx, e, p.Group, refresh)
		}
		return nil
	})
	if err != nil {
		return nil, d.wrapErr("rescue inbox rows of group "+p.Group, err)
	}
	if len(dead) > 0 {
		if err := d.notifyFinished(ctx, d.db, p.Group, dead); err != nil {
			return append(out, dead...), err
		}
	}
	return append(out, dead...), nil
}

// RescueDue implements ferrydriver.Inbox.
func (d *Driver[TTx]) RescueDue(ctx context.Context, group string) (bool, error) {
	var due bool
	if err := d.db.pipeline(ctx, step{sql: d.queries.inboxRescueDue, args: []any{group}, scan: func(r rows) error { return r.Scan(&due) }}); err != nil {
		return false, d.wrapErr("look for expired claims in group "+group, err)
	}
	return due, nil
}

// ClaimHolders implements ferrydriver.Inbox.
func (d *Driver[TTx]) ClaimHolders(ctx context.Context, group string) ([]string, error) {
	var out []string
	err := d.db.pipeline(ctx, step{sql: d.queries.inboxClaimHolders, args: []any{group}, scan: func(r rows) error {
		var w string
		if err := r.Scan(&w); err != nil {
			return err
		}
		out = append(out, w)
		return nil
	}})
	if err != nil {
		return nil, d.wrapErr("list the claim holders of group "+group, err)
	}
	return out, nil
}

// ExpireClaims implements ferrydriver.Inbox.
func (d *Driver[TTx]) ExpireClaims(ctx context.Context, p *ferrydriver.ExpireClaimsParams) (int, error) {
	group, worker := p.Group, p.Worker
	var n int64
	err := d.inRC(ctx, func(e executor) error {
		var err error
		n, err = e.exec(ctx, d.queries.inboxExpireClaims, group, worker)
		return err
	})
	if err != nil {
		return 0, d.wrapErr("expire the claims of "+worker+" in group "+group, err)
	}
	return int(n), nil
}

// CompleteInboxTx implements ferrydriver.Inbox: sqlInboxCompleteOne, and
// the settlement waiters told, in one round trip; in a transaction of
// RunInTx, in the round trip of its COMMIT (see lazyTx).
func (d *Driver[TTx]) CompleteInboxTx(ctx context.Context, tx TTx, p *ferrydriver.CompleteInboxParams) error {
	claim, err := uuid.Parse(p.Claim)
	if err != nil {
		// Not a token ClaimInbox gave: never this row's claim.
		return fmt.Errorf("ferrypg: mark event %s processed for group %s: %w", p.EventID, p.Group, ferrydriver.ErrClaimLost)
	}
	notify := step{sql: d.queries.inboxNotify, args: []any{p.Group, []uuid.UUID{p.EventID}, []string{string(ferrydriver.InboxProcessed)}, d.settleChannel()}}
	if deferFinish(any(tx), &deferredFinish{group: p.Group, ids: []uuid.UUID{p.EventID}, claims: []uuid.UUID{claim},
		steps: []step{{sql: d.queries.inboxCompleteOneCommit, args: []any{p.Group, p.EventID, claim, p.Keep}}, notify}}) {
		return nil
	}
	held := false
	err = d.wrapTx(tx).pipeline(ctx,
		step{sql: d.queries.inboxCompleteOne, args: []any{p.Group, p.EventID, claim, p.Keep}, scan: func(rows) error { held = true; return nil }},
		notify)
	if !held && (err == nil || failedStep(err) > 0) {
		// The caller rolls back whatever was done.
		return fmt.Errorf("ferrypg: mark event %s processed for group %s: %w", p.EventID, p.Group, ferrydriver.ErrClaimLost)
	}
	if err != nil {
		return d.wrapErr("mark inbox row processed", err)
	}
	return nil
}

// FailInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) FailInbox(ctx context.Context, p *ferrydriver.FailInboxParams) error {
	row := ferrydriver.FinishedRow{EventID: p.EventID, Claim: p.Claim, State: ferrydriver.InboxFailed, Error: p.Error, RetryAt: p.RetryAt, Uncounted: p.Uncounted}
	if p.Dead {
		row.State = ferrydriver.InboxDead
	}
	err := d.inTx(ctx, func(e executor) error {
		lost, err := d.finishRows(ctx, e, p.Group, []ferrydriver.FinishedRow{row}, false, nil)
		if err == nil && len(lost) > 0 {
			err = fmt.Errorf("ferrypg: mark event %s %s for group %s: %w", p.EventID, row.State, p.Group, ferrydriver.ErrClaimLost)
		}
		return err
	})
	if err != nil && !errors.Is(err, ferrydriver.ErrClaimLost) {
		return fmt.Errorf("ferrypg: record a failed attempt: %w", err)
	}
	return err
}

// finishRows records the outcomes of claimed rows in e's transaction
// (sqlInboxFinishRows) and tells the callers awaiting those that finished,
// in one round trip; keep keeps the claims on the rows not reported. It
// returns the events whose claim was lost: the caller rolls the
// transaction back.
func (d *Driver[TTx]) finishRows(ctx context.Context, e executor, group string, finished []ferrydriver.FinishedRow, keep bool, tx any) ([]uuid.UUID, error) {
	if len(finished) == 0 {
		return nil, nil
	}
	n := len(finished)
	ids, claims, states, errs := make([]uuid.UUID, n), make([]uuid.UUID, n), make([]string, n), make([]string, n)
	retry, uncounted := make([]*time.Time, n), make([]bool, n)
	var doneIDs []uuid.UUID
	var doneStates []string
	for i, r := range finished {
		claim, err := uuid.Parse(r.Claim)
		if err != nil {
			return []uuid.UUID{r.EventID}, nil // not a token ClaimInbox gave: never this row's claim
		}
		ids[i], claims[i], states[i], errs[i], uncounted[i] = r.EventID, claim, string(r.State), r.Error, r.Uncounted
		if r.State == ferrydriver.InboxFailed {
			retry[i] = &finished[i].RetryAt
		}
		if r.State.Finished() {
			doneIDs, doneStates = append(doneIDs, ids[i]), append(doneStates, states[i])
		}
	}
	var notify []step
	if len(doneIDs) > 0 {
		notify = append(notify, step{sql: d.queries.inboxNotify, args: []any{group, doneIDs, doneStates, d.settleChannel()}})
	}
	// Every row processed under one claim: sqlInboxCompleteRows.
	q, qCommit, args := d.queries.inboxFinishRows, d.queries.inboxFinishRowsCommit, []any{group, ids, claims, states, errs, retry, uncounted, keep}
	if !slices.ContainsFunc(states, func(s string) bool { return s != string(ferrydriver.InboxProcessed) }) &&
		!slices.ContainsFunc(claims, func(c uuid.UUID) bool { return c != claims[0] }) {
		q, qCommit, args = d.queries.inboxCompleteRows, d.queries.inboxCompleteRowsCommit, []any{group, ids, claims[0], keep}
	}
	if deferFinish(tx, &deferredFinish{group: group, ids: ids, claims: claims,
		steps: append([]step{{sql: qCommit, args: args}}, notify...)}) {
		return nil, nil
	}
	held := make(map[uuid.UUID]bool, n)
	steps := []step{{sql: q, args: args, scan: func(r rows) error {
		var id uuid.UUID
		if err := r.Scan(&id); err != nil {
			return err
		}
		held[id] = true
		return nil
	}}}
	err := e.pipeline(ctx, append(steps, notify...)...)
	if err != nil && failedStep(err) == 0 {
		return nil, d.wrapErr("finish inbox rows of group "+group, err)
	}
	var lost []uuid.UUID
	for _, r := range finished {
		if !held[r.EventID] {
			lost = append(lost, r.EventID)
		}
	}
	if len(lost) > 0 {
		return lost, nil // the caller rolls back: nothing else to do
	}
	if err != nil {
		return nil, d.wrapErr("notify settlement waiters", err)
	}
	return nil, nil
}

// refreshKeys recomputes keys of a group from their queues
// (sqlInboxRefreshKeys), in e's transaction: it locks them first, in key
// order, and recomputes them in a statement of its own, which sees every
// row committed before the locks were granted.
func (d *Driver[TTx]) refreshKeys(ctx context.Context, e executor, group string, keys []string) error {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	err := e.pipeline(ctx, step{sql: d.queries.inboxLockKeys, args: []any{group, keys}}, step{sql: d.queries.inboxRefreshKeys, args: []any{group, keys}})
	if err != nil {
		return d.wrapErr("recompute inbox keys of group "+group, err)
	}
	return nil
}

func scanInboxRows(r rows, group string) ([]*ferrydriver.InboxRow, error) {
	defer r.Close()
	var out []*ferrydriver.InboxRow
	for r.Next() {
		row, err := scanInboxRow(r, group)
		if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
	return out, r.Err()
}

// scanInboxRow reads the current row of r: the columns lead (read into
// lead's pointers, if any), then inboxRowColumns.
func scanInboxRow(r rows, group string, lead ...any) (*ferrydriver.InboxRow, error) {
	row := &ferrydriver.InboxRow{Group: group}
	ev := &row.Event
	var headers *string
	var state string
	dest := append(lead, &ev.ID, &ev.Key, &ev.Seq, &ev.Topic, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &ev.CreatedAt,
		&state, &row.Attempts, &row.LastError, &row.NextAttemptAt, &row.ReceivedAt, &row.FinishedAt)
	if err := r.Scan(dest...); err != nil {
		return nil, err
	}
	row.State = ferrydriver.InboxState(state)
	if row.FinishedAt.Unix() == 0 {
		row.FinishedAt = time.Time{}
	}
	if err := decodeHeaders(ev, headers); err != nil {
		return nil, err
	}
	return row, nil
}

var (
	_ ferrydriver.Inbox[pgx.Tx] = (*Driver[pgx.Tx])(nil)
)
