// A group's inbox as operators see and change it: its dead policy (and
// the sweep that re-evaluates its keys), lists, redrives, discards,
// counts, retention and attempt histories.

package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func (d *Driver) policy(ctx context.Context, group string) (bool, error) {
	var g struct {
		Hold bool `bson:"hold_dead"`
	}
	err := d.inboxGroups().FindOne(ctx, bson.D{{Key: "_id", Value: group}}).Decode(&g)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return true, nil // Hold unless told otherwise
	}
	return g.Hold, err
}

// policySweepChunk is how many keys a policy change re-evaluates per
// transaction.
const policySweepChunk = 200

// policySweep is what the inbox_groups document of a group says of its
// policy's sweep: whether one is pending, its generation (a count of
// policy changes) and the last key it re-evaluated (nil: none).
type policySweep struct {
	Sweeping bool    `bson:"sweeping"`
	Gen      int64   `bson:"sweep_gen"`
	After    *string `bson:"sweep_after"`
}

// policyUpdate stores the policy hold in a group's document: a change (or
// a first policy) starts a new sweep from the first key; the same policy
// again leaves a pending sweep where it was.
func policyUpdate(hold bool) mongo.Pipeline {
	return mongo.Pipeline{
		{{Key: "$set", Value: bson.D{{Key: "_changed", Value: expr("$ne", "$hold_dead", hold)}}}},
		{{Key: "$set", Value: bson.D{
			{Key: "hold_dead", Value: hold},
			{Key: "sweeping", Value: expr("$or", bson.D{{Key: "$ifNull", Value: bson.A{"$sweeping", false}}}, "$_changed")},
			{Key: "sweep_gen", Value: expr("$add", bson.D{{Key: "$ifNull", Value: bson.A{"$sweep_gen", int64(0)}}}, cond("$_changed", int64(1), int64(0)))},
			{Key: "sweep_after", Value: cond("$_changed", nil, bson.D{{Key: "$ifNull", Value: bson.A{"$sweep_after", nil}}})},
		}}},
		{{Key: "$unset", Value: "_changed"}},
	}
}

// sweepProgress is the filter and update that record, in a chunk's
// transaction, that the sweep of generation gen re-evaluated the keys up
// to last (more: keys may remain), or finished. A sweep of an older
// generation records nothing; one behind a concurrent sweep of the same
// generation does not move the position back.
func sweepProgress(group string, gen int64, last string, more bool) (filter, update bson.D) {
	filter = bson.D{{Key: "_id", Value: group}, {Key: "sweep_gen", Value: gen}, {Key: "sweeping", Value: true}}
	if !more {
		return filter, bson.D{{Key: "$set", Value: bson.D{{Key: "sweeping", Value: false}, {Key: "sweep_after", Value: nil}}}}
	}
	filter = append(filter, bson.E{Key: "$or", Value: bson.A{
		bson.D{{Key: "sweep_after", Value: nil}},
		bson.D{{Key: "sweep_after", Value: bson.D{{Key: "$lt", Value: last}}}},
	}})
	return filter, bson.D{{Key: "$set", Value: bson.D{{Key: "sweep_after", Value: last}}}}
}

// SetInboxPolicy implements ferrydriver.Inbox. The policy is stored with
// its sweep: the group's keys are re-evaluated a chunk at a time in key
// order (the index on inbox_keys (g, k), schema step 5), each chunk's
// transaction recording how far the sweep got, so that a call interrupted
// part-way leaves it pending and the next call resumes it.
func (d *Driver) SetInboxPolicy(ctx context.Context, p *ferrydriver.InboxPolicyParams) error {
	var sw policySweep
	err := d.inboxGroups().FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: p.Group}}, policyUpdate(p.HoldDead),
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&sw)
	if err != nil {
		return fmt.Errorf("ferrymongo: store the dead policy of group %s: %w", p.Group, err)
	}
	after := sw.After
	for chunk := 0; sw.Sweeping; chunk++ {
		p.StartChunk(chunk)
		var last *string
		var more bool
		if err := d.inTx(ctx, func(tx context.Context) error {
			filter := bson.D{{Key: "g", Value: p.Group}}
			if after != nil {
				filter = append(filter, bson.E{Key: "k", Value: bson.D{{Key: "$gt", Value: *after}}})
			}
			cur, err := d.inboxKeys().Find(tx, filter, options.Find().SetSort(bson.D{{Key: "k", Value: 1}}).
				SetLimit(policySweepChunk).SetProjection(bson.D{{Key: "k", Value: 1}}))
			if err != nil {
				return err
			}
			var keys []struct {
				K string `bson:"k"`
			}
			if err := cur.All(tx, &keys); err != nil {
				return err
			}
			now := time.Now().UTC()
			last = after
			for _, k := range keys {
				if err := d.refreshKey(tx, p.Group, k.K, now); err != nil {
					return err
				}
				last = &k.K
			}
			more = len(keys) == policySweepChunk
			var at string
			if last != nil {
				at = *last
			}
			filter, update := sweepProgress(p.Group, sw.Gen, at, more)
			_, err = d.inboxGroups().UpdateOne(tx, filter, update)
			return err
		}); err != nil {
			return fmt.Errorf("ferrymongo: re-evaluate the keys of group %s: %w", p.Group, err)
		}
		after, sw.Sweeping = last, more
	}
	return nil
}

// ListInbox implements ferrydriver.Inbox.
func (d *Driver) ListInbox(ctx context.Context, p *ferrydriver.ListInboxParams) ([]*ferrydriver.InboxRow, error) {
	want := p.States
	if len(want) == 0 {
		want = []ferrydriver.InboxState{ferrydriver.InboxDead}
	}
	// PROCESSING is not stored: a row inside its key's claim is stored
	// PENDING or FAILED, and reads as PROCESSING.
	states := bson.A{}
	processing, claimable := false, false
	for _, s := range want {
		switch s {
		case ferrydriver.InboxProcessing:
			processing = true
			continue
		case ferrydriver.InboxPending, ferrydriver.InboxFailed:
			claimable = true
		}
		states = append(states, string(s))
	}
	filter := bson.D{{Key: "g", Value: p.Group}, {Key: "state", Value: bson.D{{Key: "$in", Value: states}}}}
	if processing || claimable {
		claimed, err := d.claimRanges(ctx, p.Group)
		if err != nil {
			return nil, fmt.Errorf("ferrymongo: list inbox of group %s: %w", p.Group, err)
		}
		switch {
		case processing && len(claimed) > 0:
			filter = bson.D{{Key: "g", Value: p.Group}, {Key: "$or", Value: append(bson.A{bson.D{{Key: "state", Value: bson.D{{Key: "$in", Value: states}}}}}, claimed...)}}
		case claimable && len(claimed) > 0:
			filter = append(filter, bson.E{Key: "$nor", Value: claimed})
		}
	}
	if p.Key != "" {
		filter = append(filter, bson.E{Key: "key", Value: p.Key})
	}
	if p.Type != "" {
		filter = append(filter, bson.E{Key: "type", Value: p.Type})
	}
	if len(p.EventIDs) > 0 {
		ids := bson.A{}
		for _, id := range p.EventIDs {
			ids = append(ids, rowID(p.Group, id))
		}
		filter = append(filter, bson.E{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}})
	}
	filter = timeRange(filter, "finished_at", p.Since, p.Until)
	if err := driverkit.CheckInboxCursor(p); err != nil {
		return nil, err
	}
	if c := p.After; c != nil {
		// After (finished_at, received_at, event) in the order below.
		fin, rec := c.FinishedAt.UTC(), c.ReceivedAt.UTC()
		filter = append(filter, bson.E{Key: "$or", Value: bson.A{
			bson.D{{Key: "finished_at", Value: bson.D{{Key: "$lt", Value: fin}}}},
			bson.D{{Key: "finished_at", Value: fin}, {Key: "received_at", Value: bson.D{{Key: "$lt", Value: rec}}}},
			bson.D{{Key: "finished_at", Value: fin}, {Key: "received_at", Value: rec}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: rowID(p.Group, c.EventID)}}}},
		}})
	}
	limit := int64(p.Limit)
	if limit <= 0 {
		limit = 100
	}
	cur, err := d.inbox().Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "finished_at", Value: -1}, {Key: "received_at", Value: -1}, {Key: "_id", Value: -1}}).SetLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: list inbox of group %s: %w", p.Group, err)
	}
	out, err := d.rows(ctx, p.Group, cur)
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: list inbox of group %s: %w", p.Group, err)
	}
	return out, nil
}

// RedriveInbox implements ferrydriver.Inbox.
func (d *Driver) RedriveInbox(ctx context.Context, p *ferrydriver.InboxIDsParams) (int, error) {
	return d.setDeadState(ctx, p, ferrydriver.InboxPending)
}

// DiscardInbox implements ferrydriver.Inbox.
func (d *Driver) DiscardInbox(ctx context.Context, p *ferrydriver.InboxIDsParams) (int, error) {
	return d.setDeadState(ctx, p, ferrydriver.InboxDiscarded)
}

func (d *Driver) setDeadState(ctx context.Context, p *ferrydriver.InboxIDsParams, state ferrydriver.InboxState) (int, error) {
	changed := 0
	err := d.inTx(ctx, func(tx context.Context) error {
		changed = 0
		now := time.Now().UTC()
		keys := map[string]bool{}
		for _, id := range p.EventIDs {
			set := bson.D{{Key: "state", Value: string(state)}, {Key: "next_attempt_at", Value: now}}
			update := bson.D{{Key: "$set", Value: set}}
			if state == ferrydriver.InboxPending {
				// Unfinished again: no finish time.
				update[0].Value = append(set, bson.E{Key: "attempts", Value: 0})
				update = append(update, bson.E{Key: "$unset", Value: bson.D{{Key: "finished_at", Value: ""}}})
			} else {
				update[0].Value = append(set, bson.E{Key: "finished_at", Value: now})
			}
			var doc inboxDoc
			err := d.inbox().FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: rowID(p.Group, id)}, {Key: "state", Value: string(ferrydriver.InboxDead)}},
				update).Decode(&doc)
			if errors.Is(err, mongo.ErrNoDocuments) {
				continue
			}
			if err != nil {
				return err
			}
			if state == ferrydriver.InboxPending {
				// doc is the row before the redrive: its attempts are
				// what the redrive reset.
				if _, err := d.inbox().UpdateOne(tx, bson.D{{Key: "_id", Value: doc.ID}},
					bson.D{pushAttempt(doc.Attempts, ferrydriver.InboxPending, "", now)}); err != nil {
					return err
				}
			}
			keys[doc.Key] = true
			changed++
		}
		for k := range keys {
			if err := d.refreshKey(tx, p.Group, k, now); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: mark dead letters %s: %w", state, err)
	}
	return changed, nil
}

// InboxGroups implements ferrydriver.Admin.
func (d *Driver) InboxGroups(ctx context.Context) ([]ferrydriver.GroupPolicy, error) {
	cur, err := d.inboxGroups().Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).
		SetLimit(driverkit.MaxListedGroups).SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: "hold_dead", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: list consumer groups: %w", err)
	}
	var docs []struct {
		Group string `bson:"_id"`
		Hold  bool   `bson:"hold_dead"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("ferrymongo: list consumer groups: %w", err)
	}
	hold := make(map[string]bool, len(docs))
	for _, doc := range docs {
		hold[doc.Group] = doc.Hold
	}
	// Groups with keys whose consumer has not started yet (no stored
	// policy: holding), from the (g, runnable_at) index.
	var keyed []string
	if err := d.inboxKeys().Distinct(ctx, "g", bson.D{}).Decode(&keyed); err != nil {
		return nil, fmt.Errorf("ferrymongo: list consumer groups: %w", err)
	}
	for _, g := range keyed {
		if _, ok := hold[g]; !ok {
			hold[g] = true
		}
	}
	out := make([]ferrydriver.GroupPolicy, 0, len(hold))
	for g, h := range hold {
		out = append(out, ferrydriver.GroupPolicy{Group: g, HoldDead: h})
	}
	slices.SortFunc(out, func(a, b ferrydriver.GroupPolicy) int { return strings.Compare(a.Group, b.Group) })
	return out[:min(len(out), driverkit.MaxListedGroups)], nil
}

// claimRanges returns, for each key of the group under a claim, a filter
// of its rows inside the claim (PENDING or FAILED rows in its range),
// found through the (g, rescue_at) index: a claim's rescue is due at its
// expiry.
func (d *Driver) claimRanges(ctx context.Context, group string) (bson.A, error) {
	cur, err := d.inboxKeys().Find(ctx, bson.D{{Key: "g", Value: group}, {Key: "rescue_at", Value: bson.D{{Key: "$ne", Value: nil}}},
		{Key: "claim_token", Value: bson.D{{Key: "$ne", Value: nil}}}})
	if err != nil {
		return nil, err
	}
	var keys []keyDoc
	if err := cur.All(ctx, &keys); err != nil {
		return nil, err
	}
	out := bson.A{}
	for _, k := range keys {
		out = append(out, bson.D{{Key: "key", Value: k.Key}, {Key: "pos", Value: bson.D{{Key: "$gt", Value: k.ClaimFrom}, {Key: "$lte", Value: k.ClaimThrough}}},
			{Key: "state", Value: bson.D{{Key: "$in", Value: claimableStates}}}})
	}
	return out, nil
}

// InboxCounts implements ferrydriver.Inbox: each state counted up to the
// cap, through the (g, state, finished_at) index; rows inside claims count
// as PROCESSING, not as what they are stored as.
func (d *Driver) InboxCounts(ctx context.Context, group string) (map[ferrydriver.InboxState]int64, error) {
	fail := func(err error) (map[ferrydriver.InboxState]int64, error) {
		return nil, fmt.Errorf("ferrymongo: count inbox rows of group %s: %w", group, err)
	}
	out := map[ferrydriver.InboxState]int64{}
	for _, st := range []ferrydriver.InboxState{ferrydriver.InboxPending, ferrydriver.InboxFailed, ferrydriver.InboxDead} {
		n, err := d.inbox().CountDocuments(ctx, bson.D{{Key: "g", Value: group}, {Key: "state", Value: string(st)}},
			options.Count().SetLimit(ferrydriver.InboxCountCap))
		if err != nil {
			return fail(err)
		}
		out[st] = n
	}
	claimed, err := d.claimRanges(ctx, group)
	if err != nil || len(claimed) == 0 {
		out[ferrydriver.InboxProcessing] = 0
		return out, err
	}
	cur, err := d.inbox().Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "g", Value: group}, {Key: "$or", Value: claimed}}}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$state"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}}})
	if err != nil {
		return fail(err)
	}
	var byState []struct {
		State string `bson:"_id"`
		N     int64  `bson:"n"`
	}
	if err := cur.All(ctx, &byState); err != nil {
		return fail(err)
	}
	for _, c := range byState {
		out[ferrydriver.InboxProcessing] += c.N
		if st := ferrydriver.InboxState(c.State); out[st] < ferrydriver.InboxCountCap {
			// At the cap it stays the cap: the count is "at least".
			out[st] = max(out[st]-c.N, 0)
		}
	}
	out[ferrydriver.InboxProcessing] = min(out[ferrydriver.InboxProcessing], ferrydriver.InboxCountCap)
	return out, nil
}

// DeleteProcessedInbox implements ferrydriver.Inbox.
func (d *Driver) DeleteProcessedInbox(ctx context.Context, p *ferrydriver.DeleteProcessedInboxParams) (int64, error) {
	limit := int64(p.Limit)
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	n, err := deleteOldest(ctx, d.inbox(), bson.D{{Key: "g", Value: p.Group}, {Key: "state", Value: string(ferrydriver.InboxProcessed)},
		{Key: "finished_at", Value: bson.D{{Key: "$lt", Value: time.Now().Add(-p.OlderThan)}}}}, bson.D{{Key: "finished_at", Value: 1}}, limit)
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: delete processed inbox rows: %w", err)
	}
	// Forget idle keys, each in a transaction that re-checks it has no
	// unfinished row (an ingestion of the key conflicts with it).
	idleKey := bson.D{{Key: "g", Value: p.Group}, {Key: "runnable_at", Value: nil}, {Key: "held_by", Value: nil},
		{Key: "claim_token", Value: nil}, {Key: "rescue_at", Value: nil}}
	kc, err := d.inboxKeys().Find(ctx, idleKey,
		options.Find().SetProjection(bson.D{{Key: "k", Value: 1}}).SetLimit(limit))
	if err != nil {
		return n, fmt.Errorf("ferrymongo: find idle inbox keys: %w", err)
	}
	var idle []struct {
		K string `bson:"k"`
	}
	if err := kc.All(ctx, &idle); err != nil {
		return n, fmt.Errorf("ferrymongo: find idle inbox keys: %w", err)
	}
	for _, k := range idle {
		_ = d.inTx(ctx, func(tx context.Context) error {
			left, err := d.inbox().CountDocuments(tx, bson.D{{Key: "g", Value: p.Group}, {Key: "key", Value: k.K}, {Key: "state", Value: bson.D{{Key: "$in", Value: unfinishedStates}}}})
			if err != nil || left > 0 {
				return err
			}
			_, err = d.inboxKeys().DeleteOne(tx, append(bson.D{{Key: "_id", Value: keyID(p.Group, k.K)}}, idleKey[1:]...))
			return err
		})
	}
	return n, nil
}

// InboxAttempts implements ferrydriver.Admin.
func (d *Driver) InboxAttempts(ctx context.Context, p *ferrydriver.InboxAttemptsParams) ([]ferrydriver.AttemptRecord, error) {
	group, eventID := p.Group, p.EventID
	var doc struct {
		Log []attemptEntry `bson:"attempt_log"`
	}
	err := d.inbox().FindOne(ctx, bson.D{{Key: "_id", Value: rowID(group, eventID)}},
		options.FindOne().SetProjection(bson.D{{Key: "attempt_log", Value: 1}})).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: read the attempts of event %s: %w", eventID, err)
	}
	var out []ferrydriver.AttemptRecord
	for _, e := range doc.Log {
		out = append(out, ferrydriver.AttemptRecord{Attempt: e.N, State: ferrydriver.InboxState(e.State), Error: e.Error, At: e.At})
	}
	return out, nil
}
