package ferrypg

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

// RetractInbox implements ferrydriver.Inbox. In one transaction
// it retracts the rows the group has (rows first, then keys, in key
// order, as completion and ingestion lock them), records the events it
// never received as retracted, inserts the compensations of processed
// ones, recomputes the keys' heads and tells the callers awaiting them.
func (d *Driver[TTx]) RetractInbox(ctx context.Context, p *ferrydriver.RetractInboxParams) ([]ferrydriver.InboxState, error) {
	res := make([]ferrydriver.InboxState, len(p.Retractions))
	if len(p.Retractions) == 0 {
		return res, nil
	}
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("ferrypg: begin: %w", err)
	}
	defer func() { _ = rollback(context.WithoutCancel(ctx)) }()
	ids := make([]string, len(p.Retractions))
	index := make(map[string]int, len(ids))
	for i, r := range p.Retractions {
		ids[i] = r.Event.ID.String()
		index[ids[i]] = i
	}
	keys := map[string][]int64{} // key → positions of its rows retracted
	found, err := d.retractRows(ctx, e, p.Group, ids, keys)
	if err != nil {
		return nil, err
	}
	var absent, compensations []*ferryevent.Event
	var retracted []uuid.UUID
	for i, r := range p.Retractions {
		prior, ok := found[ids[i]]
		res[i] = prior
		switch {
		case !ok:
			absent = append(absent, r.Event)
			retracted = append(retracted, r.Event.ID)
		case prior == ferrydriver.InboxRetracted:
		case prior == ferrydriver.InboxProcessed && r.Compensation != nil:
			compensations = append(compensations, r.Compensation)
			retracted = append(retracted, r.Event.ID)
		default:
			retracted = append(retracted, r.Event.ID)
		}
	}
	// Every key the retraction touches is locked now, in key order, before
	// the inserts below upsert some of them (one at a time, they would take
	// keys out of order against an ingestion or a finish).
	for _, ev := range append(slices.Clone(absent), compensations...) {
		if _, ok := keys[ev.Key]; !ok {
			keys[ev.Key] = nil
		}
	}
	lock := slices.Sorted(maps.Keys(keys))
	if _, err := e.exec(ctx, d.queries.inboxLockKeys, p.Group, lock); err != nil {
		return nil, d.wrapErr("lock inbox keys", err)
	}
	// Events never received: recorded, then retracted like the others.
	if len(absent) > 0 {
		if err := d.insertInbox(ctx, e, p.Group, absent); err != nil {
			return nil, err
		}
		absentIDs := make([]string, len(absent))
		for i, ev := range absent {
			absentIDs[i] = ev.ID.String()
		}
		if _, err := d.retractRows(ctx, e, p.Group, absentIDs, keys); err != nil {
			return nil, err
		}
	}
	if len(compensations) > 0 {
		if err := d.insertInbox(ctx, e, p.Group, compensations); err != nil {
			return nil, err
		}
	}
	// A claim that covers a retracted row is cut short before it: the
	// worker running it finds its claim lost there.
	var claimKeys []string
	var claimPos []int64
	for key, positions := range keys {
		for _, pos := range positions {
			claimKeys, claimPos = append(claimKeys, key), append(claimPos, pos)
		}
	}
	if _, err := e.exec(ctx, d.queries.inboxRetractClaims, p.Group, claimKeys, claimPos); err != nil {
		return nil, d.wrapErr("cut the claims of retracted rows short", err)
	}
	if err := d.refreshKeys(ctx, e, p.Group, lock); err != nil {
		return nil, err
	}
	if len(retracted) > 0 {
		states := make([]string, len(retracted))
		for i := range states {
			states[i] = string(ferrydriver.InboxRetracted)
		}
		if err := d.notifySettled(ctx, e, p.Group, retracted, states); err != nil {
			return nil, err
		}
	}
	if err := commit(ctx); err != nil {
		return nil, fmt.Errorf("ferrypg: commit retraction: %w", err)
	}
	return res, nil
}

// retractRows retracts the group's rows among ids and returns the state
// each had; it adds their keys to keys.
func (d *Driver[TTx]) retractRows(ctx context.Context, e executor, group string, ids []string, keys map[string][]int64) (map[string]ferrydriver.InboxState, error) {
	r, err := e.query(ctx, d.queries.inboxRetract, group, ids)
	if err != nil {
		return nil, d.wrapErr("retract inbox rows of group "+group, err)
	}
	defer r.Close()
	found := map[string]ferrydriver.InboxState{}
	for r.Next() {
		var id, state, key string
		var pos int64
		if err := r.Scan(&id, &state, &key, &pos); err != nil {
			return nil, d.wrapErr("retract inbox rows", err)
		}
		found[id] = ferrydriver.InboxState(state)
		keys[key] = append(keys[key], pos)
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("retract inbox rows", err)
	}
	return found, nil
}

// insertInbox runs the inbox insert on e (inside a caller's transaction).
func (d *Driver[TTx]) insertInbox(ctx context.Context, e executor, group string, events []*ferryevent.Event) error {
	a, err := encodeEvents(events)
	if err != nil {
		return err
	}
	r, err := e.query(ctx, d.queries.inboxInsert, group, a.ids, a.keys, a.seqs, a.topics, a.types, a.sources, a.contentTypes, a.headers, a.payloads, a.created)
	if err != nil {
		return d.wrapErr("insert into inbox of group "+group, err)
	}
	r.Close()
	if err := r.Err(); err != nil {
		return d.wrapErr("insert into inbox of group "+group, err)
	}
	return nil
}
