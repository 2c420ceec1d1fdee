package ferrypg

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
)

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
	r, err := d.db.query(ctx, d.queries.inboxGroups, driverkit.MaxListedGroups)
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

// attemptEntry is one entry of an inbox row's attempt_log (logAttempt).
type attemptEntry struct {
	N     int       `json:"n"`
	State string    `json:"state"`
	Error string    `json:"error"`
	At    time.Time `json:"at"`
}

// InboxAttempts implements ferrydriver.Admin.
func (d *Driver[TTx]) InboxAttempts(ctx context.Context, p *ferrydriver.InboxAttemptsParams) ([]ferrydriver.AttemptRecord, error) {
	group, eventID := p.Group, p.EventID
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
