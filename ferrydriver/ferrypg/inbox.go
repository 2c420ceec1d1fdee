package ferrypg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// InsertInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) InsertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams) (*ferrydriver.InsertInboxResult, error) {
	n := len(p.Events)
	res := &ferrydriver.InsertInboxResult{Inserted: make([]bool, n)}
	if n == 0 {
		return res, nil
	}
	a, err := encodeEvents(p.Events)
	if err != nil {
		return nil, err
	}
	index := make(map[uuid.UUID]int, n)
	for i, id := range a.ids {
		index[id] = i
	}
	err = d.inRC(ctx, func(e executor) error {
		r, err := e.query(ctx, d.queries.inboxInsert, p.Group, a.ids, a.keys, a.seqs, a.topics, a.types, a.sources, a.contentTypes, a.headers, a.payloads, a.created)
		if err != nil {
			return err
		}
		defer r.Close()
		for r.Next() {
			var id uuid.UUID
			if err := r.Scan(&id); err != nil {
				return err
			}
			if i, ok := index[id]; ok {
				res.Inserted[i] = true
			}
		}
		return r.Err()
	})
	if err != nil {
		return nil, d.wrapErr("insert into inbox of group "+p.Group, err)
	}
	return res, nil
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

// inTx runs op in a READ COMMITTED transaction of the driver's own.
func (d *Driver[TTx]) inTx(ctx context.Context, op func(e executor) error) error {
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: begin: %w", err)
	}
	if err := op(e); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := commit(ctx); err != nil {
		return fmt.Errorf("ferrypg: commit: %w", err)
	}
	return nil
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
func (d *Driver[TTx]) ExpireClaims(ctx context.Context, group, worker string) (int, error) {
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

// RunInTx implements ferrydriver.Inbox: fn runs in a transaction at
// Config.InboxIsolation (READ COMMITTED by default, whatever the
// database's default_transaction_isolation). A serialization failure or a
// deadlock rolls it back and runs fn again (up to ten times), within the
// same claim: under REPEATABLE READ and SERIALIZABLE that is how the inbox
// stays consistent with concurrent deliveries.
func (d *Driver[TTx]) RunInTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	return rerunConflicts(ctx, func() error { return d.runInTxOnce(ctx, fn) })
}

// inRC runs op with an executor whose statements run at READ COMMITTED:
// the pool's sessions when that is their default (as it normally is), a
// READ COMMITTED transaction otherwise (a database whose
// default_transaction_isolation is stricter), at the cost of its BEGIN and
// COMMIT. The inbox's statements count on it: under REPEATABLE READ, a
// row another transaction changed after a statement's snapshot fails the
// statement instead of being read again.
func (d *Driver[TTx]) inRC(ctx context.Context, op func(e executor) error) error {
	if d.sessionsReadCommitted(ctx) {
		return op(d.db)
	}
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: begin: %w", err)
	}
	if err := op(e); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	return commit(ctx)
}

// sessionsReadCommitted reports whether the pool's sessions default to
// READ COMMITTED, asked once (false, and asked again, when asking fails).
func (d *Driver[TTx]) sessionsReadCommitted(ctx context.Context) bool {
	if v := d.sessionsRC.Load(); v != 0 {
		return v == 1
	}
	var iso string
	if err := queryRow(ctx, d.db, []any{&iso}, `SHOW default_transaction_isolation`); err != nil {
		return false
	}
	if iso == "read committed" {
		d.sessionsRC.Store(1)
		return true
	}
	d.sessionsRC.Store(2)
	d.cfg.Logger.Info("ferrypg: the database's default isolation is not READ COMMITTED; the inbox wraps its statements in READ COMMITTED transactions",
		"default_transaction_isolation", iso)
	return false
}

// rerunConflicts runs op again, up to ten times in all, while it fails
// with a serialization failure or a deadlock (which roll back everything).
// The waits grow (5 ms more each time, a random part of it added, so that
// workers that conflicted do not meet again in step): about 300 ms in
// all, longer than a burst of deliveries that keep touching the key rows
// completions lock (a REPEATABLE READ completion conflicts with every one
// committed after its snapshot, by design; see sqlInboxInsert).
func rerunConflicts(ctx context.Context, op func() error) error {
	for attempt := 1; ; attempt++ {
		err := op()
		if err == nil || attempt == 10 || ctx.Err() != nil || conflictCause(err) == "" {
			return err
		}
		wait := time.Duration(attempt)*5*time.Millisecond + rand.N(5*time.Millisecond)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return err
		}
	}
}

func (d *Driver[TTx]) runInTxOnce(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	if d.pool != nil {
		return d.runLazyTx(ctx, fn)
	}
	tx, commit, rollback, err := d.beginTx(ctx, d.cfg.InboxIsolation)
	if err != nil {
		return fmt.Errorf("ferrypg: %w: %w", ferrydriver.ErrTxNotBegun, err)
	}
	if err := fn(ctx, tx); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := commit(ctx); err != nil {
		return fmt.Errorf("ferrypg: commit: %w", err)
	}
	return nil
}

// runLazyTx runs fn in a lazyTx on a connection of the pool: acquiring it
// is the transaction's beginning (ErrTxNotBegun when it fails), and the
// BEGIN goes with the first statement.
func (d *Driver[TTx]) runLazyTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: %w: %w", ferrydriver.ErrTxNotBegun, err)
	}
	defer conn.Release() // a connection left in a transaction is closed, not reused
	tx := &lazyTx{d: d, conn: conn.Conn(), opts: pgx.TxOptions{IsoLevel: pgx.TxIsoLevel(d.cfg.InboxIsolation)}}
	if err := fn(ctx, any(tx).(TTx)); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		var lost *ferrydriver.ClaimsLostError
		if errors.As(err, &lost) {
			return fmt.Errorf("ferrypg: %w", err)
		}
		return fmt.Errorf("ferrypg: commit: %w", err)
	}
	return nil
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

// notifyFinished tells the callers awaiting rows that they finished, in
// the states the rows say.
func (d *Driver[TTx]) notifyFinished(ctx context.Context, e executor, group string, finished []*ferrydriver.InboxRow) error {
	ids, states := make([]uuid.UUID, len(finished)), make([]string, len(finished))
	for i, r := range finished {
		ids[i], states[i] = r.Event.ID, string(r.State)
	}
	return d.notifySettled(ctx, e, group, ids, states)
}

func (d *Driver[TTx]) notifySettled(ctx context.Context, e executor, group string, ids []uuid.UUID, states []string) error {
	var n int
	if err := queryRow(ctx, e, []any{&n}, d.queries.inboxNotify, group, ids, states, d.settleChannel()); err != nil {
		return d.wrapErr("notify settlement waiters", err)
	}
	return nil
}

// policySweepChunk is how many keys a policy change re-evaluates per
// transaction.
const policySweepChunk = 500

// SetInboxPolicy implements ferrydriver.Inbox. The policy is stored with
// its sweep (migration 018): the group's keys are re-evaluated a chunk at
// a time in key order, each chunk's transaction recording how far the
// sweep got, so that a call interrupted part-way leaves it pending and the
// next call resumes it.
func (d *Driver[TTx]) SetInboxPolicy(ctx context.Context, p *ferrydriver.InboxPolicyParams) error {
	var sweeping bool
	var gen int64
	var after *string
	if err := queryRow(ctx, d.db, []any{&sweeping, &gen, &after}, d.queries.inboxSetPolicy, p.Group, p.HoldDead); err != nil {
		return d.wrapErr("store the dead policy of group "+p.Group, err)
	}
	for chunk := 0; sweeping; chunk++ {
		p.StartChunk(chunk)
		err := d.inTx(ctx, func(e executor) error {
			var r rows
			var err error
			if after == nil {
				r, err = e.query(ctx, d.queries.inboxSweepFirst, p.Group, policySweepChunk)
			} else {
				r, err = e.query(ctx, d.queries.inboxSweepNext, p.Group, policySweepChunk, *after)
			}
			if err != nil {
				return d.wrapErr("list inbox keys of group "+p.Group, err)
			}
			keys := make([]string, 0, policySweepChunk)
			for r.Next() {
				var k string
				if err := r.Scan(&k); err != nil {
					r.Close()
					return d.wrapErr("list inbox keys of group "+p.Group, err)
				}
				keys = append(keys, k)
			}
			r.Close()
			if err := r.Err(); err != nil {
				return d.wrapErr("list inbox keys of group "+p.Group, err)
			}
			if len(keys) > 0 {
				if err := d.refreshKeys(ctx, e, p.Group, keys); err != nil {
					return err
				}
				after = &keys[len(keys)-1]
			}
			sweeping = len(keys) == policySweepChunk
			var last string
			if after != nil {
				last = *after
			}
			if _, err := e.exec(ctx, d.queries.inboxSweepProgress, p.Group, gen, last, sweeping); err != nil {
				return d.wrapErr("record the policy sweep of group "+p.Group, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (d *Driver[TTx]) settleChannel() string { return d.cfg.Schema + ".settle" }

func idStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
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

// listQuery is sqlInboxList for these states. PROCESSING is not stored:
// those rows are found through the claims, and the stored states are
// named as literals (see sqlInboxList).
func (d *Driver[TTx]) listQuery(states []string) (string, error) {
	var stored []string
	processing, unclaimed := "", false
	for _, st := range states {
		switch {
		case !ferrydriver.InboxState(st).Valid():
			return "", fmt.Errorf("%q is not an inbox state", st)
		case st == string(ferrydriver.InboxProcessing):
			processing = d.queries.inboxListProcessing
		default:
			unclaimed = unclaimed || st == string(ferrydriver.InboxPending) || st == string(ferrydriver.InboxFailed)
			stored = append(stored, "'"+st+"'")
		}
	}
	// A claimed row reads as PROCESSING: with PROCESSING asked for, every
	// row found passes (each is in a state asked for, or claimed); without
	// it, a PENDING or FAILED row passes only if no claim covers it.
	claimed := inboxListUnclaimed
	if unclaimed && processing == "" {
		claimed = inboxListClaimed
	}
	if len(stored) == 0 {
		stored = []string{"'processing'"} // stored by no row: the claims' part alone
	}
	return strings.NewReplacer("{stored}", strings.Join(stored, ", "), "{processing}", processing, "{claimed}", claimed).Replace(d.queries.inboxList), nil
}

// ListInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) ListInbox(ctx context.Context, p *ferrydriver.ListInboxParams) ([]*ferrydriver.InboxRow, error) {
	states := make([]string, len(p.States))
	for i, s := range p.States {
		states[i] = string(s)
	}
	if len(states) == 0 {
		states = []string{string(ferrydriver.InboxDead)}
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	q, err := d.listQuery(states)
	if err != nil {
		return nil, fmt.Errorf("ferrypg: list inbox of group %s: %w", p.Group, err)
	}
	if err := driverkit.CheckInboxCursor(p); err != nil {
		return nil, err
	}
	var afterFinished, afterReceived *time.Time
	afterID := uuid.Nil
	if p.After != nil {
		afterFinished, afterReceived, afterID = &p.After.FinishedAt, &p.After.ReceivedAt, p.After.EventID
	}
	r, err := d.db.queryCustom(ctx, q, p.Group, states, p.Key, p.Type, idStrings(p.EventIDs), nullTime(p.Since), nullTime(p.Until), limit,
		afterFinished, afterReceived, afterID)
	if err != nil {
		return nil, d.wrapErr("list inbox of group "+p.Group, err)
	}
	out, err := scanInboxRows(r, p.Group)
	if err != nil {
		return nil, d.wrapErr("list inbox of group "+p.Group, err)
	}
	return out, nil
}

// RedriveInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) RedriveInbox(ctx context.Context, p *ferrydriver.InboxIDsParams) (int, error) {
	return d.setDeadState(ctx, p, ferrydriver.InboxPending)
}

// DiscardInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) DiscardInbox(ctx context.Context, p *ferrydriver.InboxIDsParams) (int, error) {
	return d.setDeadState(ctx, p, ferrydriver.InboxDiscarded)
}

// setDeadState moves DEAD rows to state, then recomputes their keys' heads
// under the group's stored policy (a held key runs again: a redriven row
// first, in its order), and tells the callers awaiting discarded events.
func (d *Driver[TTx]) setDeadState(ctx context.Context, p *ferrydriver.InboxIDsParams, state ferrydriver.InboxState) (int, error) {
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("ferrypg: begin: %w", err)
	}
	defer func() { _ = rollback(context.WithoutCancel(ctx)) }()
	r, err := e.query(ctx, d.queries.inboxSetState, p.Group, idStrings(p.EventIDs), string(state))
	if err != nil {
		return 0, d.wrapErr("mark dead letters "+string(state), err)
	}
	keys := map[string]bool{}
	var ids []uuid.UUID
	for r.Next() {
		var key string
		var id uuid.UUID
		if err := r.Scan(&key, &id); err != nil {
			r.Close()
			return 0, d.wrapErr("mark dead letters", err)
		}
		keys[key] = true
		ids = append(ids, id)
	}
	r.Close()
	if err := r.Err(); err != nil {
		return 0, d.wrapErr("mark dead letters", err)
	}
	if len(keys) > 0 {
		if err := d.refreshKeys(ctx, e, p.Group, slices.Collect(maps.Keys(keys))); err != nil {
			return 0, err
		}
	}
	if state.Finished() && len(ids) > 0 {
		states := make([]string, len(ids))
		for i := range states {
			states[i] = string(state)
		}
		if err := d.notifySettled(ctx, e, p.Group, ids, states); err != nil {
			return 0, err
		}
	}
	if err := commit(ctx); err != nil {
		return 0, fmt.Errorf("ferrypg: commit: %w", err)
	}
	return len(ids), nil
}

// InboxGroups implements ferrydriver.Admin.
func (d *Driver[TTx]) InboxGroups(ctx context.Context) ([]ferrydriver.GroupPolicy, error) {
	r, err := d.db.query(ctx, d.queries.inboxGroups, ferrydriver.MaxListedGroups)
	if err != nil {
		return nil, d.wrapErr("list consumer groups", err)
	}
	defer r.Close()
	var out []ferrydriver.GroupPolicy
	for r.Next() {
		var g ferrydriver.GroupPolicy
		if err := r.Scan(&g.Group, &g.HoldDead); err != nil {
			return nil, d.wrapErr("list consumer groups", err)
		}
		out = append(out, g)
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("list consumer groups", err)
	}
	return out, nil
}

// InboxCounts implements ferrydriver.Inbox.
func (d *Driver[TTx]) InboxCounts(ctx context.Context, group string) (map[ferrydriver.InboxState]int64, error) {
	var pending, processing, failed, dead int64
	if err := queryRow(ctx, d.db, []any{&pending, &processing, &failed, &dead}, d.queries.inboxCounts, group, ferrydriver.InboxCountCap); err != nil {
		return nil, d.wrapErr("count inbox rows of group "+group, err)
	}
	return map[ferrydriver.InboxState]int64{ferrydriver.InboxPending: pending, ferrydriver.InboxProcessing: processing,
		ferrydriver.InboxFailed: failed, ferrydriver.InboxDead: dead}, nil
}

// DeleteProcessedInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) DeleteProcessedInbox(ctx context.Context, p *ferrydriver.DeleteProcessedInboxParams) (int64, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	var n int64
	err := d.inRC(ctx, func(e executor) (err error) {
		n, err = e.exec(ctx, d.queries.inboxDeleteProcessed, p.Group, p.OlderThan.Milliseconds(), limit)
		return err
	})
	if err != nil {
		return 0, d.wrapErr("delete processed inbox rows of group "+p.Group, err)
	}
	if err := d.inRC(ctx, func(e executor) error {
		_, err := e.exec(ctx, d.queries.inboxDeleteIdleKeys, p.Group, limit)
		return err
	}); err != nil {
		return n, d.wrapErr("delete idle inbox keys of group "+p.Group, err)
	}
	return n, nil
}

// InboxStates implements ferrydriver.Settler.
func (d *Driver[TTx]) InboxStates(ctx context.Context, p *ferrydriver.InboxIDsParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	return d.inboxStates(ctx, d.db, p.Group, p.EventIDs, false)
}

func (d *Driver[TTx]) inboxStates(ctx context.Context, e executor, group string, ids []uuid.UUID, lock bool) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	q := d.queries.inboxStates
	if lock {
		// Wait for a finisher that already updated a row to commit, so that
		// its outcome is seen (its NOTIFY predates our waiter).
		q += " FOR SHARE OF i"
	}
	r, err := e.query(ctx, q, group, idStrings(ids))
	if err != nil {
		return nil, d.wrapErr("read inbox states of group "+group, err)
	}
	rows, err := scanInboxRows(r, group)
	if err != nil {
		return nil, d.wrapErr("read inbox states of group "+group, err)
	}
	out := make(map[uuid.UUID]*ferrydriver.InboxRow, len(rows))
	for _, row := range rows {
		out[row.Event.ID] = row
	}
	return out, nil
}

// lastReadTimeout bounds AwaitSettled's read at its deadline.
const lastReadTimeout = 2 * time.Second

// AwaitSettled implements ferrydriver.Settler. It subscribes to the
// driver's settlement hub (one LISTEN connection shared by all callers),
// registers a waiter row (finishing one of the events then notifies), reads
// the events' states once (FOR SHARE, so that a finisher that missed the
// waiter has committed by then), and then only waits: one notification per
// finished event, no polling, and one last read at the deadline.
func (d *Driver[TTx]) AwaitSettled(ctx context.Context, p *ferrydriver.AwaitSettledParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	if !d.canWait {
		return nil, errors.New("ferrypg: AwaitSettled needs LISTEN/NOTIFY: use a pgx pool or database/sql with the pgx driver")
	}
	// Setting up is bounded by the deadline too: past it, the answer is
	// "pending".
	setup, cancelSetup := context.WithDeadline(ctx, p.Deadline)
	defer cancelSetup()
	sub, unsubscribe, err := d.hub.subscribe(setup, p.EventIDs)
	if err != nil {
		if errors.Is(err, errNotListening) {
			// Not "pending": nothing could have told us otherwise.
			return nil, fmt.Errorf("%w (AwaitSettled waited until its deadline; check the database connection and the role's rights)", err)
		}
		if ctx.Err() == nil && setup.Err() != nil {
			return map[uuid.UUID]*ferrydriver.InboxRow{}, nil
		}
		return nil, d.wrapErr("listen for settlement", err)
	}
	defer unsubscribe()
	waiter := uuid.New()
	if _, err := d.db.exec(setup, d.queries.waiterAdd, waiter, p.Group, idStrings(p.EventIDs), p.Deadline); err != nil {
		if ctx.Err() == nil && setup.Err() != nil {
			return map[uuid.UUID]*ferrydriver.InboxRow{}, nil
		}
		return nil, d.wrapErr("register settlement waiter", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = d.db.exec(rctx, d.queries.waiterRemove, waiter)
	}()
	states, err := d.inboxStates(setup, d.db, p.Group, p.EventIDs, true)
	if err != nil {
		if ctx.Err() == nil && setup.Err() != nil {
			return map[uuid.UUID]*ferrydriver.InboxRow{}, nil
		}
		return nil, err
	}
	pending := map[uuid.UUID]bool{}
	for _, id := range p.EventIDs {
		if row, ok := states[id]; !ok || !row.State.Finished() {
			pending[id] = true
		}
	}
	timer := time.NewTimer(time.Until(p.Deadline))
	defer timer.Stop()
	for len(pending) > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			// The deadline: what is left is pending, as a last read finds
			// it (a notification can be missed: a connection that dropped
			// and came back between two reads).
			last, cancel := context.WithTimeout(ctx, lastReadTimeout)
			fresh, err := d.inboxStates(last, d.db, p.Group, p.EventIDs, false)
			cancel()
			if err == nil {
				for id := range pending {
					if row, ok := fresh[id]; ok {
						states[id] = row
					}
				}
			}
			return states, nil
		case <-sub.dirty:
			// Notifications may have been missed: read again.
			fresh, err := d.inboxStates(ctx, d.db, p.Group, p.EventIDs, false)
			if err != nil {
				return nil, err
			}
			for id := range pending {
				if row, ok := fresh[id]; ok {
					states[id] = row
					if row.State.Finished() {
						delete(pending, id)
					}
				}
			}
		case payload := <-sub.notes:
			idText, state, _ := strings.Cut(payload, ":")
			id, perr := uuid.Parse(idText)
			if perr != nil || !pending[id] {
				continue
			}
			delete(pending, id)
			if ferrydriver.InboxState(state) == ferrydriver.InboxProcessed && states[id] != nil {
				states[id].State = ferrydriver.InboxProcessed
				continue
			}
			// A failure (or a row not seen before): read it for the reason.
			one, err := d.inboxStates(ctx, d.db, p.Group, []uuid.UUID{id}, false)
			if err != nil {
				return nil, err
			}
			if row := one[id]; row != nil {
				states[id] = row
			}
		}
	}
	return states, nil
}

var (
	_ ferrydriver.Inbox[pgx.Tx] = (*Driver[pgx.Tx])(nil)
)

// attemptEntry is one entry of an inbox row's attempt_log (logAttempt).
type attemptEntry struct {
	N     int       `json:"n"`
	State string    `json:"state"`
	Error string    `json:"error"`
	At    time.Time `json:"at"`
}

// InboxAttempts implements ferrydriver.Admin.
func (d *Driver[TTx]) InboxAttempts(ctx context.Context, group string, eventID uuid.UUID) ([]ferrydriver.AttemptRecord, error) {
	r, err := d.db.query(ctx, d.queries.inboxAttempts, group, eventID.String())
	if err != nil {
		return nil, d.wrapErr("read the attempts of event "+eventID.String(), err)
	}
	defer r.Close()
	var out []ferrydriver.AttemptRecord
	for r.Next() {
		var text string
		if err := r.Scan(&text); err != nil {
			return nil, d.wrapErr("read the attempts of event "+eventID.String(), err)
		}
		var entries []attemptEntry
		if err := json.Unmarshal([]byte(text), &entries); err != nil {
			return nil, fmt.Errorf("ferrypg: the attempt log of event %s in group %s: %w", eventID, group, err)
		}
		for _, e := range entries {
			out = append(out, ferrydriver.AttemptRecord{Attempt: e.N, State: ferrydriver.InboxState(e.State), Error: e.Error, At: e.At})
		}
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("read the attempts of event "+eventID.String(), err)
	}
	return out, nil
}
