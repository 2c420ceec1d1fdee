package ferrypg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
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
	index := make(map[string]int, n)
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
			var id string
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

// ClaimInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	token := uuid.NewString() // one per call: each row is claimed once in it
	q := d.queries.inboxClaim
	if p.Rescue {
		q = d.queries.inboxRescue
	}
	var out []*ferrydriver.InboxRow
	err := d.inRC(ctx, func(e executor) error {
		out = out[:0]
		return e.pipeline(ctx, step{sql: q, args: []any{p.Group, p.Limit, p.Worker, p.TTL.Milliseconds(),
			token, p.MaxAttempts, ferrydriver.ReasonAttemptsExhausted}, scan: func(r rows) error {
			row, err := scanInboxRow(r, p.Group)
			out = append(out, row)
			return err
		}})
	})
	if err != nil {
		return nil, d.wrapErr("claim inbox rows of group "+p.Group, err)
	}
	var dead []string
	for _, row := range out {
		if row.State == ferrydriver.InboxProcessing {
			row.Claim = token
		} else {
			dead = append(dead, row.Event.ID.String())
		}
	}
	if len(dead) > 0 {
		// After the claim's commit: a waiter registered since reads the
		// row as DEAD.
		if err := d.notifySettled(ctx, d.db, p.Group, dead, ferrydriver.InboxDead); err != nil {
			return out, err
		}
	}
	return out, nil
}

// RescueDue implements ferrydriver.Inbox.
func (d *Driver[TTx]) RescueDue(ctx context.Context, group string) (bool, error) {
	var due bool
	if err := queryRow(ctx, d.db, []any{&due}, d.queries.inboxRescueDue, group); err != nil {
		return false, d.wrapErr("look for expired claims in group "+group, err)
	}
	return due, nil
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

// CompleteInboxTx implements ferrydriver.Inbox.
func (d *Driver[TTx]) CompleteInboxTx(ctx context.Context, tx TTx, p *ferrydriver.CompleteInboxParams) error {
	return d.finish(ctx, d.wrapTx(tx), p.Group, p.EventID.String(), p.Claim, ferrydriver.InboxProcessed, "", nil, false)
}

// FailInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) FailInbox(ctx context.Context, p *ferrydriver.FailInboxParams) error {
	state := ferrydriver.InboxFailed
	var retry *time.Time
	if p.Dead {
		state = ferrydriver.InboxDead
	} else {
		retry = &p.RetryAt
	}
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: begin: %w", err)
	}
	if err := d.finish(ctx, e, p.Group, p.EventID.String(), p.Claim, state, p.Error, retry, p.Uncounted); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := commit(ctx); err != nil {
		return fmt.Errorf("ferrypg: commit failed attempt: %w", err)
	}
	return nil
}

// finish moves a claimed row to state, then recomputes its key's head:
// update the row and lock the key (one statement), and only then (in a new
// statement, so with a snapshot taken after the lock) look for the next
// head and tell the callers awaiting the event. Both go in one round trip:
// the refresh finds the key by the event. When the claim is lost the
// refresh still runs (and may have locked the key for itself) but the
// caller rolls the transaction back.
func (d *Driver[TTx]) finish(ctx context.Context, e executor, group, id, claim string, state ferrydriver.InboxState, lastErr string, retry *time.Time, uncounted bool) error {
	if _, err := uuid.Parse(claim); err != nil {
		return fmt.Errorf("ferrypg: mark event %s %s for group %s: claim token %q is not one ClaimInbox gave: %w", id, state, group, claim, ferrydriver.ErrClaimLost)
	}
	held := false
	err := e.pipeline(ctx,
		step{sql: d.queries.inboxFinish, args: []any{group, id, claim, string(state), lastErr, retry, uncounted},
			scan: func(rows) error { held = true; return nil }},
		step{sql: d.queries.inboxRefreshKeyNotify, args: []any{group, id, string(state), d.settleChannel()}})
	if !held && (err == nil || failedStep(err) > 0) {
		// Lost (whatever the refresh did, or failed to do, is rolled back).
		return fmt.Errorf("ferrypg: mark event %s %s for group %s: %w", id, state, group, ferrydriver.ErrClaimLost)
	}
	if err != nil {
		return d.wrapErr("mark inbox row "+string(state), err)
	}
	return nil
}

// refreshKey recomputes a key's head under the group's stored dead policy.
func (d *Driver[TTx]) refreshKey(ctx context.Context, e executor, group, key string) error {
	if _, err := e.exec(ctx, d.queries.inboxLockKey, group, key); err != nil {
		return d.wrapErr("lock inbox key", err)
	}
	if _, err := e.exec(ctx, d.queries.inboxRefreshKey, group, key); err != nil {
		return d.wrapErr("refresh inbox key", err)
	}
	return nil
}

func (d *Driver[TTx]) notifySettled(ctx context.Context, e executor, group string, ids []string, state ferrydriver.InboxState) error {
	var n int
	if err := queryRow(ctx, e, []any{&n}, d.queries.inboxNotify, group, ids, string(state), d.settleChannel()); err != nil {
		return d.wrapErr("notify settlement waiters", err)
	}
	return nil
}

// SetInboxPolicy implements ferrydriver.Inbox.
func (d *Driver[TTx]) SetInboxPolicy(ctx context.Context, p *ferrydriver.InboxPolicyParams) error {
	var changed bool
	if err := queryRow(ctx, d.db, []any{&changed}, d.queries.inboxSetPolicy, p.Group, p.HoldDead); err != nil {
		return d.wrapErr("store the dead policy of group "+p.Group, err)
	}
	if !changed {
		return nil
	}
	r, err := d.db.query(ctx, d.queries.inboxGroupKeys, p.Group)
	if err != nil {
		return d.wrapErr("list inbox keys", err)
	}
	var keys []string
	for r.Next() {
		var k string
		if err := r.Scan(&k); err != nil {
			r.Close()
			return d.wrapErr("list inbox keys", err)
		}
		keys = append(keys, k)
	}
	r.Close()
	if err := r.Err(); err != nil {
		return d.wrapErr("list inbox keys", err)
	}
	for start := 0; start < len(keys); start += 500 {
		e, commit, rollback, err := d.begin.begin(ctx)
		if err != nil {
			return fmt.Errorf("ferrypg: begin: %w", err)
		}
		for _, k := range keys[start:min(start+500, len(keys))] {
			if err := d.refreshKey(ctx, e, p.Group, k); err != nil {
				_ = rollback(context.WithoutCancel(ctx))
				return err
			}
		}
		if err := commit(ctx); err != nil {
			return fmt.Errorf("ferrypg: commit: %w", err)
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

// scanInboxRow reads the current row of r (inboxRowColumns).
func scanInboxRow(r rows, group string) (*ferrydriver.InboxRow, error) {
	row := &ferrydriver.InboxRow{Group: group}
	ev := &row.Event
	var headers *string
	var state string
	if err := r.Scan(&ev.ID, &ev.Key, &ev.Seq, &ev.Topic, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &ev.CreatedAt,
		&state, &row.Attempts, &row.LastError, &row.NextAttemptAt, &row.ReceivedAt, &row.FinishedAt); err != nil {
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
	literals := make([]string, len(states))
	for i, st := range states {
		if !ferrydriver.InboxState(st).Valid() {
			return nil, fmt.Errorf("ferrypg: list inbox of group %s: %q is not an inbox state", p.Group, st)
		}
		literals[i] = "'" + st + "'"
	}
	q := strings.Replace(d.queries.inboxList, "{states}", strings.Join(literals, ", "), 1)
	r, err := d.db.query(ctx, q, p.Group, states, p.Key, p.Type, idStrings(p.EventIDs), nullTime(p.Since), nullTime(p.Until), limit)
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
	var ids []string
	for r.Next() {
		var key, id string
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
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted) // lock keys in order, like ingestion
	for _, key := range sorted {
		if err := d.refreshKey(ctx, e, p.Group, key); err != nil {
			return 0, err
		}
	}
	if state.Finished() && len(ids) > 0 {
		if err := d.notifySettled(ctx, e, p.Group, ids, state); err != nil {
			return 0, err
		}
	}
	if err := commit(ctx); err != nil {
		return 0, fmt.Errorf("ferrypg: commit: %w", err)
	}
	return len(ids), nil
}

// InboxGroups implements ferrydriver.GroupLister.
func (d *Driver[TTx]) InboxGroups(ctx context.Context) ([]string, error) {
	r, err := d.db.query(ctx, d.queries.inboxGroups, ferrydriver.MaxListedGroups)
	if err != nil {
		return nil, d.wrapErr("list consumer groups", err)
	}
	defer r.Close()
	var out []string
	for r.Next() {
		var g string
		if err := r.Scan(&g); err != nil {
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
		limit = 5000
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
		q += " FOR SHARE"
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

// AwaitSettled implements ferrydriver.Settler. It subscribes to the
// driver's settlement hub (one LISTEN connection shared by all callers),
// registers a waiter row (finishing one of the events then notifies), reads
// the events' states once (FOR SHARE, so that a finisher that missed the
// waiter has committed by then), and then only waits: one notification per
// finished event, no polling.
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
			return states, nil // the deadline: what is left is pending
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

var _ ferrydriver.Inbox[pgx.Tx] = (*Driver[pgx.Tx])(nil)
