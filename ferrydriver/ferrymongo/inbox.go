package ferrymongo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// The inbox follows the model of the relational backends: one document per
// (group, event), one <prefix>inbox_keys document per (group, key) saying
// when the key's head may run. Every change of a key's head writes its key
// document in the same transaction, so that two workers changing one key
// conflict (one transaction aborts) instead of both succeeding. Claim and
// retry times use the workers' clocks: keep them within a few seconds.

var unfinishedStates = bson.A{string(ferrydriver.InboxPending), string(ferrydriver.InboxProcessing), string(ferrydriver.InboxFailed), string(ferrydriver.InboxDead)}

// unfinishedUnder is the states of a key's rows that a head is read from
// under the group's dead policy: a DEAD row holds the key (hold) or is
// passed over.
func unfinishedUnder(hold bool) bson.A {
	if hold {
		return unfinishedStates
	}
	return unfinishedStates[:3]
}

type inboxID struct {
	Group string `bson:"g"`
	Event string `bson:"e"`
}

type inboxDoc struct {
	ID             inboxID           `bson:"_id"`
	Group          string            `bson:"g"`
	Pos            int64             `bson:"pos"`
	Key            string            `bson:"key"`
	Seq            int64             `bson:"seq"`
	Topic          string            `bson:"topic"`
	Type           string            `bson:"type"`
	Source         string            `bson:"source,omitempty"`
	ContentType    string            `bson:"ct,omitempty"`
	Headers        map[string]string `bson:"headers,omitempty"`
	Payload        []byte            `bson:"payload"`
	Created        createdAt         `bson:",inline"`
	State          string            `bson:"state"`
	Attempts       int               `bson:"attempts"`
	LastError      string            `bson:"last_error,omitempty"`
	NextAttemptAt  time.Time         `bson:"next_attempt_at"`
	ClaimedBy      string            `bson:"claimed_by,omitempty"`
	ClaimToken     string            `bson:"claim_token,omitempty"`
	ClaimExpiresAt *time.Time        `bson:"claim_expires_at,omitempty"`
	ReceivedAt     time.Time         `bson:"received_at"`
	FinishedAt     *time.Time        `bson:"finished_at,omitempty"`
}

// attemptEntry is one entry of an inbox row's attempt_log, its history
// (ferrydriver.Admin): only InboxAttempts reads it.
type attemptEntry struct {
	N     int       `bson:"n"`
	State string    `bson:"state"`
	Error string    `bson:"error"`
	At    time.Time `bson:"at"`
}

// pushAttempt is the update operator that appends an entry to a row's
// history, keeping its latest driverkit.AttemptHistory entries.
func pushAttempt(n int, state ferrydriver.InboxState, errText string, at time.Time) bson.E {
	if r := []rune(errText); len(r) > driverkit.AttemptErrorChars {
		errText = string(r[:driverkit.AttemptErrorChars])
	}
	entry := attemptEntry{N: n, State: string(state), Error: errText, At: at}
	return bson.E{Key: "$push", Value: bson.D{{Key: "attempt_log", Value: bson.D{
		{Key: "$each", Value: bson.A{entry}}, {Key: "$slice", Value: -driverkit.AttemptHistory}}}}}
}

func (d *inboxDoc) row() (*ferrydriver.InboxRow, error) {
	o := outboxDoc{ID: d.ID.Event, Topic: d.Topic, Key: d.Key, Seq: d.Seq, Type: d.Type, Source: d.Source, ContentType: d.ContentType,
		Headers: d.Headers, Payload: d.Payload, Created: d.Created}
	ev, err := o.event()
	if err != nil {
		return nil, err
	}
	r := &ferrydriver.InboxRow{Group: d.Group, Event: *ev, State: ferrydriver.InboxState(d.State), Attempts: d.Attempts,
		LastError: d.LastError, NextAttemptAt: d.NextAttemptAt, ReceivedAt: d.ReceivedAt}
	if d.FinishedAt != nil {
		r.FinishedAt = *d.FinishedAt
	}
	return r, nil
}

func (d *Driver) coll(name string) *mongo.Collection {
	return d.db.Collection(d.cfg.Prefix+name, options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadConcern(readconcern.Majority()))
}

func (d *Driver) inbox() *mongo.Collection       { return d.coll("inbox") }
func (d *Driver) inboxKeys() *mongo.Collection   { return d.coll("inbox_keys") }
func (d *Driver) inboxGroups() *mongo.Collection { return d.coll("inbox_groups") }
func (d *Driver) counters() *mongo.Collection    { return d.coll("counters") }
func (d *Driver) meta() *mongo.Collection        { return d.coll("meta") }

func keyID(group, key string) bson.D { return bson.D{{Key: "g", Value: group}, {Key: "k", Value: key}} }

func rowID(group string, id uuid.UUID) bson.D {
	return bson.D{{Key: "g", Value: group}, {Key: "e", Value: id.String()}}
}

func decodeRows(ctx context.Context, cur *mongo.Cursor) ([]*ferrydriver.InboxRow, error) {
	defer cur.Close(ctx)
	var out []*ferrydriver.InboxRow
	for cur.Next(ctx) {
		var doc inboxDoc
		if err := cur.Decode(&doc); err != nil {
			return nil, err
		}
		r, err := doc.row()
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, cur.Err()
}

// InsertInbox implements ferrydriver.Inbox in one transaction: the events
// not recorded yet take positions from the group's counter (so that
// concurrent ingestions of a group serialise, keeping each key's delivery
// order), and their keys become runnable unless they wait already.
func (d *Driver) InsertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams) ([]bool, error) {
	res := make([]bool, len(p.Events))
	if len(p.Events) == 0 {
		return res, nil
	}
	err := d.inTx(ctx, func(tx context.Context) error {
		clear(res)
		return d.insertInboxTx(tx, p.Group, p.Events, res)
	})
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: insert into inbox of group %s: %w", p.Group, err)
	}
	return res, nil
}

// insertInboxTx records events for group inside tx, setting inserted[i]
// for each new one, and makes the keys that had nothing to do runnable.
func (d *Driver) insertInboxTx(tx context.Context, group string, events []*ferryevent.Event, inserted []bool) error {
	ids := make(bson.A, len(events))
	for i, ev := range events {
		ids[i] = rowID(group, ev.ID)
	}
	cur, err := d.inbox().Find(tx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return err
	}
	var have []struct {
		ID inboxID `bson:"_id"`
	}
	if err := cur.All(tx, &have); err != nil {
		return err
	}
	known := map[string]bool{}
	for _, h := range have {
		known[h.ID.Event] = true
	}
	var fresh []int
	for i, ev := range events {
		if id := ev.ID.String(); !known[id] {
			known[id] = true // a duplicate within the call inserts once
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	var counter struct {
		N int64 `bson:"n"`
	}
	if err := d.counters().FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: "inbox:" + group}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int64(len(fresh))}}}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&counter); err != nil {
		return err
	}
	now := time.Now().UTC()
	pos := counter.N - int64(len(fresh))
	docs := make([]any, 0, len(fresh))
	var keys []string
	for _, i := range fresh {
		ev := events[i]
		pos++
		payload := ev.Payload
		if payload == nil {
			payload = []byte{}
		}
		docs = append(docs, &inboxDoc{ID: inboxID{Group: group, Event: ev.ID.String()}, Group: group, Pos: pos, Key: ev.Key, Seq: ev.Seq,
			Topic: ev.Topic, Type: ev.Type, Source: ev.Source, ContentType: ev.ContentType, Headers: ev.Headers, Payload: payload,
			Created: created(ev.CreatedAt), State: string(ferrydriver.InboxPending), NextAttemptAt: now, ReceivedAt: now})
		keys = append(keys, ev.Key)
		inserted[i] = true
	}
	if _, err := d.inbox().InsertMany(tx, docs); err != nil {
		return err
	}
	slices.Sort(keys)
	idle := expr("$and", expr("$eq", bson.D{{Key: "$ifNull", Value: bson.A{"$runnable_at", nil}}}, nil),
		expr("$eq", bson.D{{Key: "$ifNull", Value: bson.A{"$held_by", nil}}}, nil))
	for _, k := range slices.Compact(keys) {
		if _, err := d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(group, k)}},
			mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "g", Value: literal(group)}, {Key: "k", Value: literal(k)},
				{Key: "runnable_at", Value: cond(idle, now, "$runnable_at")},
				// Every write of a key document changes it, so that two
				// transactions touching one key always conflict.
				{Key: "v", Value: expr("$add", bson.D{{Key: "$ifNull", Value: bson.A{"$v", int64(0)}}}, int64(1))}}}}},
			options.UpdateOne().SetUpsert(true)); err != nil {
			return err
		}
	}
	return nil
}

// head is a key's oldest unfinished row and whether another row runs.
type head struct {
	doc       *inboxDoc
	hold      bool // the group's dead policy, as the head was read under it
	busyUntil *time.Time
	// stale: another row of the key is PROCESSING under a claim that
	// expired (a row redriven ahead of it is the head): the key waits for
	// a rescue, which takes the head.
	stale bool
}

// view is the head as inboxmodel.Decide reads it.
func (h *head) view() inboxmodel.KeyHead {
	if h.doc == nil {
		return inboxmodel.KeyHead{}
	}
	v := inboxmodel.KeyHead{State: ferrydriver.InboxState(h.doc.State), RetryAt: h.doc.NextAttemptAt, Stale: h.stale}
	if h.doc.ClaimExpiresAt != nil {
		v.ClaimExpires = *h.doc.ClaimExpiresAt
	}
	if h.busyUntil != nil {
		v.BusyUntil = *h.busyUntil
	}
	return v
}

// keyHead reads a key's head in tx: its oldest unfinished row (a DEAD row
// counts under the group's stored policy Hold, or when none is stored).
func (d *Driver) keyHead(tx context.Context, group, key string, now time.Time) (*head, error) {
	hold, err := d.policy(tx, group)
	if err != nil {
		return nil, err
	}
	states := unfinishedUnder(hold)
	h := &head{hold: hold}
	var doc inboxDoc
	err = d.inbox().FindOne(tx, bson.D{{Key: "g", Value: group}, {Key: "key", Value: key}, {Key: "state", Value: bson.D{{Key: "$in", Value: states}}}},
		options.FindOne().SetSort(bson.D{{Key: "pos", Value: 1}})).Decode(&doc)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
	case err != nil:
		return nil, err
	default:
		h.doc = &doc
	}
	busyFilter := bson.D{{Key: "g", Value: group}, {Key: "key", Value: key}, {Key: "state", Value: string(ferrydriver.InboxProcessing)},
		{Key: "claim_expires_at", Value: bson.D{{Key: "$gt", Value: now}}}}
	if h.doc != nil {
		busyFilter = append(busyFilter, bson.E{Key: "_id", Value: bson.D{{Key: "$ne", Value: h.doc.ID}}})
	}
	var busy inboxDoc
	err = d.inbox().FindOne(tx, busyFilter, options.FindOne().SetSort(bson.D{{Key: "claim_expires_at", Value: -1}})).Decode(&busy)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
	case err != nil:
		return nil, err
	default:
		h.busyUntil = busy.ClaimExpiresAt
	}
	if h.doc != nil && h.doc.State != string(ferrydriver.InboxProcessing) {
		staleFilter := append(expiredClaims(group, now), bson.E{Key: "key", Value: key}, bson.E{Key: "_id", Value: bson.D{{Key: "$ne", Value: h.doc.ID}}})
		err := d.inbox().FindOne(tx, staleFilter, options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
		case err != nil:
			return nil, err
		default:
			h.stale = true
		}
	}
	return h, nil
}

// refreshKey recomputes when a key's head may run (inboxmodel.Schedule),
// in tx.
func (d *Driver) refreshKey(tx context.Context, group, key string, now time.Time) error {
	h, err := d.keyHead(tx, group, key, now)
	if err != nil {
		return err
	}
	var runnable, heldBy any
	switch at, held := inboxmodel.Schedule(h.view(), now); {
	case held:
		heldBy = h.doc.ID.Event
	case !at.IsZero():
		runnable = at
	}
	_, err = d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(group, key)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "g", Value: group}, {Key: "k", Value: key}, {Key: "runnable_at", Value: runnable}, {Key: "held_by", Value: heldBy}}},
			{Key: "$inc", Value: bson.D{{Key: "v", Value: int64(1)}}}},
		options.UpdateOne().SetUpsert(true))
	return err
}

// ClaimInbox implements ferrydriver.Inbox: for each due key, one short
// transaction re-reads its head and claims it. A key another worker
// claimed meanwhile conflicts and is skipped.
func (d *Driver) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	now := time.Now().UTC()
	// As many keys as both Limit and Keys allow; Limit bounds the rows
	// too (a key's run counts its rows).
	limit := int64(max(p.Limit, 1))
	if p.Keys > 0 {
		limit = min(limit, int64(p.Keys))
	}
	var cur *mongo.Cursor
	var err error
	if p.Rescue {
		// A run's rows share the claim's expiry: the keys are the first
		// limit distinct ones (below), not the first limit rows.
		cur, err = d.inbox().Find(ctx, expiredClaims(p.Group, now),
			options.Find().SetSort(bson.D{{Key: "claim_expires_at", Value: 1}}).SetProjection(bson.D{{Key: "key", Value: 1}}))
	} else {
		cur, err = d.inboxKeys().Find(ctx, bson.D{{Key: "g", Value: p.Group}, {Key: "runnable_at", Value: bson.D{{Key: "$lte", Value: now}}}},
			options.Find().SetSort(bson.D{{Key: "runnable_at", Value: 1}}).SetLimit(limit))
	}
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: claim inbox rows of group %s: %w", p.Group, err)
	}
	keys, err := claimKeys(ctx, cur, int(limit))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: claim inbox rows of group %s: %w", p.Group, err)
	}
	var out []*ferrydriver.InboxRow
	for _, k := range keys {
		if len(out) >= max(p.Limit, 1) {
			break
		}
		rows, err := d.claimKey(ctx, p, k, max(p.Limit, 1)-len(out))
		if err != nil {
			if hasLabel(err, labelTransient) || hasCode(err, codeWriteConflict) {
				continue // another worker changed the key first
			}
			return out, fmt.Errorf("ferrymongo: claim key %s of group %s: %w", k, p.Group, err)
		}
		out = append(out, rows...)
	}
	return out, nil
}

// claimKeys reads the first limit distinct keys from cur: inbox_keys
// documents (k), or inbox rows under expired claims (key), and closes it.
func claimKeys(ctx context.Context, cur *mongo.Cursor, limit int) ([]string, error) {
	defer cur.Close(ctx)
	var keys []string
	seen := map[string]bool{}
	for len(keys) < limit && cur.Next(ctx) {
		var doc struct {
			K   string `bson:"k"`   // an inbox_keys document's
			Key string `bson:"key"` // an inbox document's (Rescue)
		}
		if err := cur.Decode(&doc); err != nil {
			return nil, err
		}
		k := cmp.Or(doc.K, doc.Key)
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys, cur.Err()
}

// claimKey claims the head of one key (and, with p.PerKey, a run of its
// rows: see claimKeyTx), at most room rows, in a transaction of its own,
// without WithTransaction's retries: a conflict means someone else has it.
func (d *Driver) claimKey(ctx context.Context, p *ferrydriver.ClaimInboxParams, key string, room int) ([]*ferrydriver.InboxRow, error) {
	tx, sess, end, err := d.startTx(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	rows, err := d.claimKeyTx(tx, p, key, room)
	if err != nil {
		_ = sess.AbortTransaction(context.WithoutCancel(tx))
		return nil, err
	}
	if err := sess.CommitTransaction(tx); err != nil {
		return nil, err
	}
	return rows, nil
}

// claimKeyTx claims, in tx, the key's head and, when the head is PENDING
// and p.PerKey > 1 (an ordinary claim), the key's next PENDING rows, up to
// p.PerKey rows and room: a run, each row PROCESSING under one token,
// passing DEAD rows that the group's policy lets the key pass and stopping
// at any other row that cannot run now. A head whose attempts are spent
// goes DEAD instead.
func (d *Driver) claimKeyTx(tx context.Context, p *ferrydriver.ClaimInboxParams, key string, room int) ([]*ferrydriver.InboxRow, error) {
	now := time.Now().UTC()
	h, err := d.keyHead(tx, p.Group, key, now)
	if err != nil {
		return nil, err
	}
	switch inboxmodel.Decide(h.view(), now, p.Rescue) {
	case inboxmodel.Wait:
		return nil, d.refreshKey(tx, p.Group, key, now)
	case inboxmodel.LeaveToRescue:
		// Left to a rescue; to the back for a second, so that it cannot
		// crowd out the others.
		_, err := d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(p.Group, key)}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "runnable_at", Value: now.Add(time.Second)}}}, {Key: "$inc", Value: bson.D{{Key: "v", Value: int64(1)}}}})
		return nil, err
	case inboxmodel.LeaveToClaim:
		return nil, nil
	}
	if p.MaxAttempts > 0 && h.doc.Attempts >= p.MaxAttempts {
		// Its last attempts lost their claims: give it up.
		reason := ferrydriver.ReasonAttemptsExhausted
		if h.doc.LastError != "" {
			reason += " (last recorded error: " + h.doc.LastError + ")"
		}
		var doc inboxDoc
		err := d.inbox().FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: h.doc.ID}, {Key: "state", Value: h.doc.State}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: string(ferrydriver.InboxDead)}, {Key: "last_error", Value: reason},
				{Key: "finished_at", Value: now}}},
				{Key: "$unset", Value: bson.D{{Key: "claimed_by", Value: ""}, {Key: "claim_expires_at", Value: ""}, {Key: "claim_token", Value: ""}}},
				pushAttempt(h.doc.Attempts, ferrydriver.InboxDead, ferrydriver.ReasonAttemptsExhausted, now)},
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&doc)
		if err != nil {
			return nil, err
		}
		if err := d.refreshKey(tx, p.Group, key, now); err != nil {
			return nil, err
		}
		row, err := doc.row()
		if err != nil {
			return nil, err
		}
		return []*ferrydriver.InboxRow{row}, nil
	}
	run := bson.A{h.doc.ID}
	if h.doc.State == string(ferrydriver.InboxPending) && !p.Rescue && p.PerKey > 1 {
		more, err := d.runAfter(tx, p.Group, key, h, min(p.PerKey, room)-1)
		if err != nil {
			return nil, err
		}
		run = append(run, more...)
	}
	// The run's rows in one update and one read, whatever its length.
	expires := now.Add(p.TTL)
	token := uuid.NewString()
	inRun := bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: run}}}}
	res, err := d.inbox().UpdateMany(tx, inRun,
		bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: string(ferrydriver.InboxProcessing)}, {Key: "claimed_by", Value: p.Worker},
			{Key: "claim_token", Value: token}, {Key: "claim_expires_at", Value: expires}}}, {Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}}})
	if err != nil {
		return nil, err
	}
	if res.MatchedCount != int64(len(run)) {
		return nil, fmt.Errorf("claim a run of %d rows of key %s: %d found", len(run), key, res.MatchedCount)
	}
	cur, err := d.inbox().Find(tx, inRun, options.Find().SetSort(bson.D{{Key: "pos", Value: 1}}))
	if err != nil {
		return nil, err
	}
	out, err := decodeRows(tx, cur)
	if err != nil {
		return nil, err
	}
	for i, row := range out {
		row.Claim = token
		if i < len(out)-1 {
			row.Claim += runMark
		}
	}
	if _, err := d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(p.Group, key)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "runnable_at", Value: expires}}}, {Key: "$inc", Value: bson.D{{Key: "v", Value: int64(1)}}}}); err != nil {
		return nil, err
	}
	return out, nil
}

// runMark ends the claim string of a claimed row with later rows in its
// run, so that its finish knows, in any process, whether it has a rest to
// give back: a head claimed alone, the common case without a backlog,
// finishes with no update more than before runs.
const runMark = "+run"

// runAfter returns the ids of the rows a run takes after its PENDING head
// h, at most n (inboxmodel.RunRows): the key's next PENDING rows, in
// order, passing DEAD rows that the group's policy lets the key pass (the
// query leaves them out, so that they do not count toward its limit) and
// stopping at any other row that cannot run now.
func (d *Driver) runAfter(tx context.Context, group, key string, h *head, n int) (bson.A, error) {
	if n <= 0 {
		return nil, nil
	}
	cur, err := d.inbox().Find(tx, bson.D{{Key: "g", Value: group}, {Key: "key", Value: key}, {Key: "pos", Value: bson.D{{Key: "$gt", Value: h.doc.Pos}}},
		{Key: "state", Value: bson.D{{Key: "$in", Value: unfinishedUnder(h.hold)}}}},
		options.Find().SetSort(bson.D{{Key: "pos", Value: 1}}).SetLimit(int64(n)).SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: "state", Value: 1}}))
	if err != nil {
		return nil, err
	}
	var docs []struct {
		ID    bson.Raw `bson:"_id"`
		State string   `bson:"state"`
	}
	if err := cur.All(tx, &docs); err != nil {
		return nil, err
	}
	states := make([]ferrydriver.InboxState, len(docs))
	for i, doc := range docs {
		states[i] = ferrydriver.InboxState(doc.State)
	}
	var out bson.A
	for _, i := range inboxmodel.RunRows(states, h.hold, n) {
		out = append(out, docs[i].ID)
	}
	return out, nil
}

// RunInTx implements ferrydriver.Inbox: fn runs in a session transaction
// (majority), run again by the driver on a TransientTransactionError.
func (d *Driver) RunInTx(ctx context.Context, fn func(ctx context.Context, tx context.Context) error) error {
	ran := false
	err := d.inTx(ctx, func(tx context.Context) error { ran = true; return fn(tx, tx) })
	if err != nil && !ran {
		return fmt.Errorf("%w: %w", ferrydriver.ErrTxNotBegun, err)
	}
	return err
}

// CompleteInboxTx implements ferrydriver.Inbox.
func (d *Driver) CompleteInboxTx(_ context.Context, tx context.Context, p *ferrydriver.CompleteInboxParams) error {
	return d.finish(tx, p.Group, p.EventID, p.Claim, ferrydriver.InboxProcessed, "", nil, false, p.Keep)
}

// FailInbox implements ferrydriver.Inbox.
func (d *Driver) FailInbox(ctx context.Context, p *ferrydriver.FailInboxParams) error {
	state := ferrydriver.InboxFailed
	var retry *time.Time
	if p.Dead {
		state = ferrydriver.InboxDead
	} else {
		at := p.RetryAt.UTC()
		retry = &at
	}
	return d.inTx(ctx, func(tx context.Context) error {
		return d.finish(tx, p.Group, p.EventID, p.Claim, state, p.Error, retry, p.Uncounted, false)
	})
}

// finish moves a claimed row to state and, unless keep, gives the rest of
// its run back (when its claim says rows follow: runMark): the key's
// later rows still PROCESSING under the claim become PENDING again, their
// attempt taken back (they run again under a later claim, uncounted).
func (d *Driver) finish(tx context.Context, group string, id uuid.UUID, claim string, state ferrydriver.InboxState, lastErr string, retry *time.Time, uncounted, keep bool) error {
	claim, more := strings.CutSuffix(claim, runMark)
	if claim == "" {
		return fmt.Errorf("ferrymongo: mark event %s %s for group %s: no claim token: %w", id, state, group, ferrydriver.ErrClaimLost)
	}
	now := time.Now().UTC()
	set := bson.D{{Key: "state", Value: string(state)}}
	if state != ferrydriver.InboxProcessed {
		set = append(set, bson.E{Key: "last_error", Value: lastErr})
	}
	if retry != nil {
		set = append(set, bson.E{Key: "next_attempt_at", Value: *retry})
	}
	if state == ferrydriver.InboxProcessed || state == ferrydriver.InboxDead {
		set = append(set, bson.E{Key: "finished_at", Value: now})
	}
	var doc inboxDoc
	err := d.inbox().FindOneAndUpdate(tx,
		bson.D{{Key: "_id", Value: rowID(group, id)}, {Key: "claim_token", Value: claim}, {Key: "state", Value: string(ferrydriver.InboxProcessing)},
			{Key: "claim_expires_at", Value: bson.D{{Key: "$gt", Value: now}}}},
		finishUpdate(set, uncounted)).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return fmt.Errorf("ferrymongo: mark event %s %s for group %s: %w", id, state, group, ferrydriver.ErrClaimLost)
	}
	if err != nil {
		return fmt.Errorf("ferrymongo: mark inbox row %s: %w", state, err)
	}
	if !uncounted && (state == ferrydriver.InboxFailed || state == ferrydriver.InboxDead) {
		// The history's entry: doc is the row before the update, its
		// attempts this attempt's number (the claim counted it).
		if _, err := d.inbox().UpdateOne(tx, bson.D{{Key: "_id", Value: doc.ID}},
			bson.D{pushAttempt(doc.Attempts, state, lastErr, now)}); err != nil {
			return fmt.Errorf("ferrymongo: record the failed attempt of event %s: %w", id, err)
		}
	}
	if more && !keep {
		if _, err := d.inbox().UpdateMany(tx, bson.D{{Key: "g", Value: group}, {Key: "key", Value: doc.Key}, {Key: "pos", Value: bson.D{{Key: "$gt", Value: doc.Pos}}},
			{Key: "state", Value: string(ferrydriver.InboxProcessing)}, {Key: "claim_token", Value: claim}},
			finishUpdate(bson.D{{Key: "state", Value: string(ferrydriver.InboxPending)}}, true)); err != nil {
			return fmt.Errorf("ferrymongo: give back the rest of a run of inbox key %s: %w", doc.Key, err)
		}
	}
	if err := d.refreshKey(tx, group, doc.Key, now); err != nil {
		return fmt.Errorf("ferrymongo: refresh inbox key %s: %w", doc.Key, err)
	}
	return nil
}

// finishUpdate ends a claim with set; uncounted takes its attempt back.
func finishUpdate(set bson.D, uncounted bool) bson.D {
	u := bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: bson.D{{Key: "claimed_by", Value: ""}, {Key: "claim_expires_at", Value: ""}, {Key: "claim_token", Value: ""}}}}
	if uncounted {
		u = append(u, bson.E{Key: "$inc", Value: bson.D{{Key: "attempts", Value: -1}}})
	}
	return u
}

var _ ferrydriver.Inbox[context.Context] = (*Driver)(nil)
