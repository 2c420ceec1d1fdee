package ferrymongo

import (
	"context"
	"fmt"
	"slices"
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
// when the key's head may run and holding its claim (claim.go). Every change of a key's head writes its key
// document in the same transaction, so that two workers changing one key
// conflict (one transaction aborts) instead of both succeeding. Claim and
// retry times use the workers' clocks: keep them within a few seconds.

var unfinishedStates = bson.A{string(ferrydriver.InboxPending), string(ferrydriver.InboxFailed), string(ferrydriver.InboxDead)}

// claimableStates are the states of the rows a claim covers (a PENDING or
// FAILED row inside its key's claim reads as PROCESSING: see claim.go).
var claimableStates = unfinishedStates[:2]

// unfinishedUnder is the states of a key's rows that a head is read from
// under the group's dead policy: a DEAD row holds the key (hold) or is
// passed over.
func unfinishedUnder(hold bool) bson.A {
	if hold {
		return unfinishedStates
	}
	return claimableStates
}

type inboxID struct {
	Group string `bson:"g"`
	Event string `bson:"e"`
}

type inboxDoc struct {
	ID            inboxID           `bson:"_id"`
	Group         string            `bson:"g"`
	Pos           int64             `bson:"pos"`
	Key           string            `bson:"key"`
	Seq           int64             `bson:"seq"`
	Topic         string            `bson:"topic"`
	Type          string            `bson:"type"`
	Source        string            `bson:"source,omitempty"`
	ContentType   string            `bson:"ct,omitempty"`
	Headers       map[string]string `bson:"headers,omitempty"`
	Payload       []byte            `bson:"payload"`
	Created       createdAt         `bson:",inline"`
	State         string            `bson:"state"`
	Attempts      int               `bson:"attempts"`
	LastError     string            `bson:"last_error,omitempty"`
	NextAttemptAt time.Time         `bson:"next_attempt_at"`
	ReceivedAt    time.Time         `bson:"received_at"`
	FinishedAt    *time.Time        `bson:"finished_at,omitempty"`
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

// rows decodes the inbox documents of cur, those inside their key's claim
// PROCESSING (claimedRows).
func (d *Driver) rows(ctx context.Context, group string, cur *mongo.Cursor) ([]*ferrydriver.InboxRow, error) {
	var docs []inboxDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, err
	}
	return d.claimedRows(ctx, group, docs)
}

// InsertInbox implements ferrydriver.Inbox in one transaction: the events
// not recorded yet take positions from the group's counter (so that
// concurrent ingestions of a group serialise, keeping each key's delivery
// order), and their keys become runnable unless they wait already.
func (d *Driver) InsertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams) ([]bool, error) {
	res, _, err := d.insertInbox(ctx, p, nil)
	return res, err
}

// InsertInboxClaim implements ferrydriver.InboxIngestClaimer: InsertInbox
// whose transaction also claims, as a claim would, the new rows of up to
// c.Keys of the keys that had nothing to do, in key order. A key is taken
// when it had no claim, no hold and no rescue due, and its first
// unfinished row is one this call inserted (every row before finished);
// another transaction changing the key meanwhile conflicts, and the
// whole runs again.
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
	var claimed []*ferrydriver.InboxRow
	err := d.inTx(ctx, func(tx context.Context) error {
		clear(res)
		claimed = nil
		var free []*keyDoc
		if c != nil && c.Keys > 0 {
			var err error
			if free, err = d.freeKeys(tx, p.Group, p.Events); err != nil {
				return err
			}
		}
		from, err := d.insertInboxTx(tx, p.Group, p.Events, res)
		if err != nil {
			return err
		}
		// Only the keys this call inserted rows of.
		fresh := map[string]bool{}
		for i, ev := range p.Events {
			fresh[ev.Key] = fresh[ev.Key] || res[i]
		}
		free = slices.DeleteFunc(free, func(k *keyDoc) bool { return !fresh[k.Key] })
		if len(free) == 0 {
			return nil
		}
		claimed, err = d.claimIngested(tx, p.Group, c, free, from)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("ferrymongo: insert into inbox of group %s: %w", p.Group, err)
	}
	return res, claimed, nil
}

// freeKeys reads, in tx, the documents of events' keys that have no
// claim, no hold and no rescue due, in key order; a key without one yet
// comes as a document of its own.
func (d *Driver) freeKeys(tx context.Context, group string, events []*ferryevent.Event) ([]*keyDoc, error) {
	keys := make([]string, len(events))
	for i, ev := range events {
		keys[i] = ev.Key
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	ids := make(bson.A, len(keys))
	for i, k := range keys {
		ids[i] = keyID(group, k)
	}
	cur, err := d.inboxKeys().Find(tx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return nil, err
	}
	var docs []*keyDoc
	if err := cur.All(tx, &docs); err != nil {
		return nil, err
	}
	known := make(map[string]*keyDoc, len(docs))
	for _, k := range docs {
		known[k.Key] = k
	}
	var out []*keyDoc
	for _, key := range keys {
		k := known[key]
		switch {
		case k == nil:
			out = append(out, &keyDoc{Group: group, Key: key})
		case k.ClaimToken == nil && k.HeldBy == nil && k.RescueAt == nil:
			out = append(out, k)
		}
	}
	return out, nil
}

// claimIngested claims, in tx, of the free keys (freeKeys) up to c.Keys
// whose first unfinished row is at position from or after (one the
// ingest inserted), their first c.PerKey rows.
func (d *Driver) claimIngested(tx context.Context, group string, c *ferrydriver.IngestClaimParams, free []*keyDoc, from int64) ([]*ferrydriver.InboxRow, error) {
	hold, err := d.policy(tx, group)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	p := &ferrydriver.ClaimInboxParams{Group: group, Worker: c.Worker, TTL: c.TTL}
	token := uuid.NewString() // one claim, as the interface says: one token
	n := max(c.PerKey, 1)
	var out []*ferrydriver.InboxRow
	keys := 0
	for _, k := range free {
		if keys == c.Keys {
			break
		}
		q, _, err := d.queue(tx, group, k.Key, hold, n)
		if err != nil {
			return nil, err
		}
		if len(q) == 0 || q[0].Pos < from {
			continue // rows before the ingest's wait (or none was inserted)
		}
		act, run := inboxmodel.ClaimKey(q, k.SuspectThrough, hold, n, now, 0)
		if act != inboxmodel.ClaimRows {
			continue
		}
		rows, err := d.claimRows(tx, p, k.Key, token, q[0].Pos, q[run[len(run)-1]].Pos, k.SuspectThrough, now)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
		keys++
	}
	return out, nil
}

// insertInboxTx records events for group inside tx, setting inserted[i]
// for each new one, and makes the keys that had nothing to do runnable.
// It returns the first position it gave (0 when it inserted nothing).
func (d *Driver) insertInboxTx(tx context.Context, group string, events []*ferryevent.Event, inserted []bool) (int64, error) {
	ids := make(bson.A, len(events))
	for i, ev := range events {
		ids[i] = rowID(group, ev.ID)
	}
	cur, err := d.inbox().Find(tx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return 0, err
	}
	var have []struct {
		ID inboxID `bson:"_id"`
	}
	if err := cur.All(tx, &have); err != nil {
		return 0, err
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
		return 0, nil
	}
	var counter struct {
		N int64 `bson:"n"`
	}
	if err := d.counters().FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: "inbox:" + group}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int64(len(fresh))}}}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&counter); err != nil {
		return 0, err
	}
	now := time.Now().UTC()
	pos := counter.N - int64(len(fresh))
	from := pos + 1
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
		return 0, err
	}
	slices.Sort(keys)
	// A key with nothing to do becomes runnable; one that waits (a retry,
	// a claim, a rescue, a dead head) keeps its time.
	isNull := func(field string) bson.D {
		return expr("$eq", bson.D{{Key: "$ifNull", Value: bson.A{field, nil}}}, nil)
	}
	idle := expr("$and", isNull("$runnable_at"), isNull("$held_by"), isNull("$claim_token"), isNull("$rescue_at"))
	for _, k := range slices.Compact(keys) {
		if _, err := d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(group, k)}},
			mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "g", Value: literal(group)}, {Key: "k", Value: literal(k)},
				{Key: "runnable_at", Value: cond(idle, now, "$runnable_at")},
				// Every write of a key document changes it, so that two
				// transactions touching one key always conflict.
				{Key: "v", Value: expr("$add", bson.D{{Key: "$ifNull", Value: bson.A{"$v", int64(0)}}}, int64(1))}}}}},
			options.UpdateOne().SetUpsert(true)); err != nil {
			return 0, err
		}
	}
	return from, nil
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

var (
	_ ferrydriver.Inbox[context.Context] = (*Driver)(nil)
	_ ferrydriver.InboxIngestClaimer     = (*Driver)(nil)
)
