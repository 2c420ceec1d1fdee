package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Leases use the server's clock ($$NOW), never the relays' own.

type leaseDoc struct {
	Holder    string    `bson:"holder"`
	Term      int64     `bson:"term"`
	ExpiresAt time.Time `bson:"expires_at"`
	Now       time.Time `bson:"now"`
}

func (l *leaseDoc) lease(name string) *ferrydriver.Lease {
	return &ferrydriver.Lease{Name: name, Holder: l.Holder, Term: l.Term, ExpiresAt: l.ExpiresAt, Now: l.Now}
}

func expr(op string, args ...any) bson.D { return bson.D{{Key: op, Value: bson.A(args)}} }

// literal keeps a user's string from being read as a field path ("$x")
// or a variable ("$$x") inside an aggregation expression.
func literal(v any) bson.D { return bson.D{{Key: "$literal", Value: v}} }

func cond(ifExpr, then, otherwise any) bson.D {
	return bson.D{{Key: "$cond", Value: bson.A{ifExpr, then, otherwise}}}
}

// AcquireLease implements ferrydriver.Store in one atomic update: the
// lease is taken if free or expired (term + 1), renewed if held by holder
// (same term), left alone otherwise; the document as it now stands comes
// back with the server's clock.
func (d *Driver) AcquireLease(ctx context.Context, p *ferrydriver.AcquireLeaseParams) (*ferrydriver.Lease, error) {
	expires := bson.D{{Key: "$ifNull", Value: bson.A{"$expires_at", time.Unix(0, 0)}}}
	mine := expr("$eq", "$holder", literal(p.Holder))
	live := expr("$gt", expires, "$$NOW")
	free := expr("$or", mine, expr("$not", live))
	term := bson.D{{Key: "$ifNull", Value: bson.A{"$term", int64(0)}}}
	update := mongo.Pipeline{{{Key: "$set", Value: bson.D{
		{Key: "term", Value: cond(expr("$and", mine, live), term, cond(free, expr("$add", term, int64(1)), term))},
		{Key: "holder", Value: cond(free, literal(p.Holder), "$holder")},
		{Key: "expires_at", Value: cond(free, expr("$add", "$$NOW", p.TTL.Milliseconds()), "$expires_at")},
		{Key: "now", Value: "$$NOW"},
	}}}}
	var l leaseDoc
	err := d.leases.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: p.Name}}, update,
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&l)
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: acquire lease %s: %w", p.Name, err)
	}
	return l.lease(p.Name), nil
}

// RenewLease implements ferrydriver.Store.
func (d *Driver) RenewLease(ctx context.Context, p *ferrydriver.RenewLeaseParams) (*ferrydriver.Lease, error) {
	filter := bson.D{{Key: "_id", Value: p.Name}, {Key: "holder", Value: p.Holder}, {Key: "term", Value: p.Term},
		{Key: "$expr", Value: expr("$gt", "$expires_at", "$$NOW")}}
	update := mongo.Pipeline{{{Key: "$set", Value: bson.D{
		{Key: "expires_at", Value: expr("$add", "$$NOW", p.TTL.Milliseconds())}, {Key: "now", Value: "$$NOW"}}}}}
	var l leaseDoc
	err := d.leases.FindOneAndUpdate(ctx, filter, update, options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&l)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("ferrymongo: renew lease %s at term %d: %w", p.Name, p.Term, ferrydriver.ErrLeaseLost)
	}
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: renew lease %s: %w", p.Name, err)
	}
	return l.lease(p.Name), nil
}

// ReleaseLease implements ferrydriver.Store.
func (d *Driver) ReleaseLease(ctx context.Context, p *ferrydriver.ReleaseLeaseParams) error {
	_, err := d.leases.UpdateOne(ctx, bson.D{{Key: "_id", Value: p.Name}, {Key: "holder", Value: p.Holder}, {Key: "term", Value: p.Term}},
		mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "expires_at", Value: expr("$subtract", "$$NOW", int64(1))}}}}})
	if err != nil {
		return fmt.Errorf("ferrymongo: release lease %s: %w", p.Name, err)
	}
	return nil
}

// GetLease implements ferrydriver.Store.
func (d *Driver) GetLease(ctx context.Context, name string) (*ferrydriver.Lease, error) {
	pipeline := mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "_id", Value: name}}}},
		{{Key: "$set", Value: bson.D{{Key: "now", Value: "$$NOW"}}}},
	}
	cur, err := d.leases.Aggregate(ctx, pipeline)
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: read lease %s: %w", name, err)
	}
	defer cur.Close(ctx)
	if !cur.Next(ctx) {
		if err := cur.Err(); err != nil {
			return nil, fmt.Errorf("ferrymongo: read lease %s: %w", name, err)
		}
		return nil, fmt.Errorf("ferrymongo: lease %s: %w", name, ferrydriver.ErrNotFound)
	}
	var l leaseDoc
	if err := cur.Decode(&l); err != nil {
		return nil, fmt.Errorf("ferrymongo: read lease %s: %w", name, err)
	}
	return l.lease(name), nil
}

// ListLeases implements ferrydriver.Store: the leases whose _id
// starts with prefix (an anchored regular expression, served by the _id
// index), each with the server's clock.
func (d *Driver) ListLeases(ctx context.Context, prefix string) ([]*ferrydriver.Lease, error) {
	pipeline := mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$regex", Value: "^" + regexp.QuoteMeta(prefix)}}}}}},
		{{Key: "$sort", Value: bson.D{{Key: "_id", Value: 1}}}},
		{{Key: "$set", Value: bson.D{{Key: "now", Value: "$$NOW"}}}},
	}
	cur, err := d.leases.Aggregate(ctx, pipeline)
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: list leases %s*: %w", prefix, err)
	}
	defer cur.Close(ctx)
	var out []*ferrydriver.Lease
	for cur.Next(ctx) {
		var l struct {
			ID       string `bson:"_id"`
			leaseDoc `bson:",inline"`
		}
		if err := cur.Decode(&l); err != nil {
			return nil, fmt.Errorf("ferrymongo: list leases %s*: %w", prefix, err)
		}
		out = append(out, l.lease(l.ID))
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("ferrymongo: list leases %s*: %w", prefix, err)
	}
	return out, nil
}

// fenced runs fn in a transaction that first touches the lease document
// under the holder's term: a concurrent take-over writes the same
// document, so one of the two transactions aborts; and an expired or lost
// lease matches nothing, which is ErrLeaseLost.
func (d *Driver) fenced(ctx context.Context, name, holder string, term int64, op string, fn func(tx context.Context) error) error {
	return d.inTx(ctx, func(tx context.Context) error {
		res, err := d.leases.UpdateOne(tx,
			bson.D{{Key: "_id", Value: name}, {Key: "holder", Value: holder}, {Key: "term", Value: term},
				{Key: "$expr", Value: expr("$gt", "$expires_at", "$$NOW")}},
			// A counter, not a time: the write must change the document
			// every time, or MongoDB skips it and it conflicts with nothing.
			bson.D{{Key: "$inc", Value: bson.D{{Key: "fence", Value: int64(1)}}}})
		if err != nil {
			return fmt.Errorf("ferrymongo: %s: %w", op, err)
		}
		if res.MatchedCount == 0 {
			return fmt.Errorf("ferrymongo: %s at term %d: %w", op, term, ferrydriver.ErrLeaseLost)
		}
		return fn(tx)
	})
}

type checkpointDoc struct {
	Partition int       `bson:"p"`
	Cursor    []byte    `bson:"cursor"`
	Term      int64     `bson:"term"`
	UpdatedAt time.Time `bson:"updated_at"`
}

// LoadCheckpoint implements ferrydriver.Store.
func (d *Driver) LoadCheckpoint(ctx context.Context, p *ferrydriver.LoadCheckpointParams) (*ferrydriver.Checkpoint, error) {
	cp := &ferrydriver.Checkpoint{Feed: p.Feed}
	var doc checkpointDoc
	err := d.checkpoints.FindOne(ctx, bson.D{{Key: "_id", Value: p.Feed}}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return cp, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: load checkpoint of %s: %w", p.Feed, err)
	}
	cp.Cursor, cp.Term, cp.UpdatedAt = doc.Cursor, doc.Term, doc.UpdatedAt
	return cp, nil
}

// SaveCheckpoint implements ferrydriver.Store, fenced by the lease.
func (d *Driver) SaveCheckpoint(ctx context.Context, p *ferrydriver.SaveCheckpointParams) error {
	return d.fenced(ctx, p.Feed, p.Holder, p.Term, "save checkpoint of "+p.Feed, func(tx context.Context) error {
		_, err := d.checkpoints.UpdateOne(tx, bson.D{{Key: "_id", Value: p.Feed}},
			mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "p", Value: p.Partition}, {Key: "cursor", Value: p.Cursor},
				{Key: "term", Value: p.Term}, {Key: "updated_at", Value: "$$NOW"}}}}},
			options.UpdateOne().SetUpsert(true))
		if err != nil {
			return fmt.Errorf("ferrymongo: save checkpoint of %s: %w", p.Feed, err)
		}
		return nil
	})
}

type deadLetterDoc struct {
	ID       bson.D    `bson:"_id"`
	Feed     string    `bson:"feed"`
	Event    outboxDoc `bson:"event"`
	Reason   string    `bson:"reason"`
	FailedAt time.Time `bson:"failed_at"`
}

// InsertDeadLetters implements ferrydriver.Store, fenced by the lease.
func (d *Driver) InsertDeadLetters(ctx context.Context, p *ferrydriver.InsertDeadLettersParams) error {
	return d.fenced(ctx, p.Feed, p.Holder, p.Term, "insert dead letters of "+p.Feed, func(tx context.Context) error {
		for _, dl := range p.DeadLetters {
			ev := &dl.Event
			doc := outboxDoc{ID: ev.ID.String(), Partition: d.PartitionOf(ev.Key), Topic: ev.Topic, Key: ev.Key, Seq: ev.Seq, Type: ev.Type,
				Source: ev.Source, ContentType: ev.ContentType, Headers: ev.Headers, Payload: ev.Payload, CreatedAt: ev.CreatedAt.UTC()}
			if doc.Payload == nil {
				doc.Payload = []byte{}
			}
			id := bson.D{{Key: "feed", Value: p.Feed}, {Key: "event", Value: doc.ID}}
			_, err := d.deadLetters.UpdateOne(tx, bson.D{{Key: "_id", Value: id}},
				bson.D{{Key: "$setOnInsert", Value: bson.D{{Key: "feed", Value: p.Feed}, {Key: "event", Value: doc},
					{Key: "reason", Value: dl.Reason}, {Key: "failed_at", Value: time.Now().UTC()}}}},
				options.UpdateOne().SetUpsert(true))
			if err != nil {
				return fmt.Errorf("ferrymongo: insert dead letter %s: %w", doc.ID, err)
			}
		}
		return nil
	})
}

func (d *Driver) decodeDeadLetters(ctx context.Context, cur *mongo.Cursor) ([]*ferrydriver.DeadLetter, error) {
	defer cur.Close(ctx)
	var out []*ferrydriver.DeadLetter
	for cur.Next(ctx) {
		var doc deadLetterDoc
		if err := cur.Decode(&doc); err != nil {
			return nil, err
		}
		ev, _ := doc.Event.event() // shown even if malformed: that may be why it is here
		out = append(out, &ferrydriver.DeadLetter{Feed: doc.Feed, Event: *ev, Reason: doc.Reason, FailedAt: doc.FailedAt})
	}
	return out, cur.Err()
}

// deadLetterFilter selects dead letters by each criterion that is set: a
// partition exactly, a feed's partitions by an anchored pattern (served
// by the index on feed), a reason containing the text.
func deadLetterFilter(p *ferrydriver.ListDeadLettersParams) bson.D {
	filter := bson.D{}
	exact, family := driverkit.FeedFilter(p.Feed)
	for _, f := range []struct{ field, v string }{{"feed", exact}, {"event.key", p.Key}, {"event.type", p.Type}, {"event.topic", p.Topic}} {
		if f.v != "" {
			filter = append(filter, bson.E{Key: f.field, Value: f.v})
		}
	}
	if family != "" {
		filter = append(filter, bson.E{Key: "feed", Value: feedFamily(family)})
	}
	if p.Reason != "" {
		filter = append(filter, bson.E{Key: "reason", Value: bson.D{{Key: "$regex", Value: regexp.QuoteMeta(p.Reason)}}})
	}
	if len(p.EventIDs) > 0 {
		list := make(bson.A, len(p.EventIDs))
		for i, id := range p.EventIDs {
			list[i] = id.String()
		}
		filter = append(filter, bson.E{Key: "event._id", Value: bson.D{{Key: "$in", Value: list}}})
	}
	return timeRange(filter, "failed_at", p.Since, p.Until)
}

// feedFamily matches the partitions of a feed: family ("hooks/") then a
// partition number.
func feedFamily(family string) bson.D {
	return bson.D{{Key: "$regex", Value: "^" + regexp.QuoteMeta(family) + "[0-9]+$"}}
}

// refIDs are the _ids of the named dead letters.
func refIDs(refs []ferrydriver.DeadLetterRef) bson.A {
	ids := make(bson.A, len(refs))
	for i, r := range refs {
		ids[i] = bson.D{{Key: "feed", Value: r.Feed}, {Key: "event", Value: r.EventID.String()}}
	}
	return ids
}

// RedriveDeadLetters implements ferrydriver.Store: in one transaction, the
// named dead letters are checked, appended to their keys' parked queues
// in their feeds (each feed's positions drawn from its counter, as
// ParkEvents does), marked redriven, and deleted.
func (d *Driver) RedriveDeadLetters(ctx context.Context, p *ferrydriver.DeadLetterSelection) (int, error) {
	if len(p.Letters) == 0 {
		return 0, nil
	}
	var n int
	err := d.inTx(ctx, func(tx context.Context) error {
		n = 0
		cur, err := d.deadLetters.Find(tx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: refIDs(p.Letters)}}}},
			options.Find().SetSort(bson.D{{Key: "failed_at", Value: 1}, {Key: "event.seq", Value: 1}}))
		if err != nil {
			return fmt.Errorf("ferrymongo: select dead letters to redrive: %w", err)
		}
		var docs []deadLetterDoc
		if err := cur.All(tx, &docs); err != nil {
			return fmt.Errorf("ferrymongo: select dead letters to redrive: %w", err)
		}
		ids := make(bson.A, 0, len(docs))
		perFeed := map[string]int64{}
		var feeds []string
		for i := range docs {
			ev, err := docs[i].Event.event()
			if err == nil {
				// No size limit: the event was accepted once, under the producer's.
				err = ferryevent.Validate(ev, 0, math.MaxInt)
			}
			if err != nil {
				return fmt.Errorf("ferrymongo: dead letter %s of feed %s is not a valid event (%v): nothing was redriven; discard it (ferry dlq discard --feed %s %s)",
					docs[i].Event.ID, docs[i].Feed, err, docs[i].Feed, docs[i].Event.ID)
			}
			ids = append(ids, docs[i].ID)
			if perFeed[docs[i].Feed] == 0 {
				feeds = append(feeds, docs[i].Feed)
			}
			perFeed[docs[i].Feed]++
		}
		if len(ids) == 0 {
			return nil
		}
		pos := map[string]int64{}
		for _, feed := range feeds {
			var counter struct {
				N int64 `bson:"n"`
			}
			if err := d.counters().FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: "parked:" + feed}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: perFeed[feed]}}}},
				options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&counter); err != nil {
				return fmt.Errorf("ferrymongo: park redriven dead letters for %s: %w", feed, err)
			}
			pos[feed] = counter.N - perFeed[feed]
		}
		now := time.Now().UTC()
		for i := range docs { // oldest failure first, each key in order
			dl := &docs[i]
			pos[dl.Feed]++
			doc := parkedDoc{Feed: dl.Feed, Key: dl.Event.Key, Pos: pos[dl.Feed], Event: dl.Event, ParkedAt: now,
				Reason: "redriven by an operator after: " + dl.Reason, Redriven: true}
			if _, err := d.parked().UpdateOne(tx, bson.D{{Key: "_id", Value: parkedID(dl.Feed, dl.Event.ID)}},
				bson.D{{Key: "$setOnInsert", Value: doc}}, options.UpdateOne().SetUpsert(true)); err != nil {
				return fmt.Errorf("ferrymongo: park redriven dead letter %s for %s: %w", dl.Event.ID, dl.Feed, err)
			}
		}
		res, err := d.deadLetters.DeleteMany(tx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
		if err != nil {
			return fmt.Errorf("ferrymongo: delete redriven dead letters: %w", err)
		}
		n = int(res.DeletedCount)
		return nil
	})
	return n, err
}

// DiscardDeadLetters implements ferrydriver.Store.
func (d *Driver) DiscardDeadLetters(ctx context.Context, p *ferrydriver.DeadLetterSelection) (int, error) {
	if len(p.Letters) == 0 {
		return 0, nil
	}
	res, err := d.deadLetters.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: refIDs(p.Letters)}}}})
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: discard dead letters: %w", err)
	}
	return int(res.DeletedCount), nil
}

// ListDeadLetters implements ferrydriver.Store.
func (d *Driver) ListDeadLetters(ctx context.Context, p *ferrydriver.ListDeadLettersParams) ([]*ferrydriver.DeadLetter, error) {
	filter := deadLetterFilter(p)
	if p.After != nil {
		at := p.After.FailedAt.UTC()
		filter = bson.D{{Key: "$and", Value: bson.A{filter, bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "failed_at", Value: bson.D{{Key: "$lt", Value: at}}}},
			bson.D{{Key: "failed_at", Value: at}, {Key: "event._id", Value: bson.D{{Key: "$gt", Value: p.After.EventID.String()}}}},
		}}}}}}
	}
	limit := int64(p.Limit)
	if limit <= 0 {
		limit = 100
	}
	cur, err := d.deadLetters.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "failed_at", Value: -1}, {Key: "event._id", Value: 1}}).SetLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: list dead letters: %w", err)
	}
	return d.decodeDeadLetters(ctx, cur)
}

// CountDeadLetters implements ferrydriver.Store.
func (d *Driver) CountDeadLetters(ctx context.Context, p *ferrydriver.ListDeadLettersParams) (int64, error) {
	n, err := d.deadLetters.CountDocuments(ctx, deadLetterFilter(p))
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: count dead letters: %w", err)
	}
	return n, nil
}

// GetDeadLetter implements ferrydriver.Store.
func (d *Driver) GetDeadLetter(ctx context.Context, p *ferrydriver.GetDeadLetterParams) (*ferrydriver.DeadLetter, error) {
	filter := deadLetterFilter(&ferrydriver.ListDeadLettersParams{Feed: p.Feed, EventIDs: []uuid.UUID{p.EventID}})
	cur, err := d.deadLetters.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "failed_at", Value: -1}}).SetLimit(1))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: read dead letter: %w", err)
	}
	out, err := d.decodeDeadLetters(ctx, cur)
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: read dead letter: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("ferrymongo: dead letter %s: %w", p.EventID, ferrydriver.ErrNotFound)
	}
	return out[0], nil
}

// partitionLow is the oldest position any feed of the partition still
// needs: the earliest acknowledged-event time among the saved checkpoints
// (and cur), minus the recovery margin. Events created before it have been
// delivered by every feed.
func (d *Driver) partitionLow(ctx context.Context, partition int, cur []byte) (time.Time, error) {
	c, err := decodeCursor(cur)
	if err != nil {
		return time.Time{}, err
	}
	low := c.At
	if low.IsZero() && len(cur) > 0 {
		return time.Time{}, nil
	}
	found, err := d.checkpoints.Find(ctx, bson.D{{Key: "p", Value: partition}})
	if err != nil {
		return time.Time{}, fmt.Errorf("ferrymongo: read the checkpoints of partition %d: %w", partition, err)
	}
	defer found.Close(ctx)
	for found.Next(ctx) {
		var doc checkpointDoc
		if err := found.Decode(&doc); err != nil {
			return time.Time{}, err
		}
		other, err := decodeCursor(doc.Cursor)
		if err != nil {
			return time.Time{}, err
		}
		if other.recovering() || other.At.IsZero() {
			return time.Time{}, nil // a feed is recovering or has delivered nothing: keep everything
		}
		if low.IsZero() || other.At.Before(low) {
			low = other.At
		}
	}
	if err := found.Err(); err != nil {
		return time.Time{}, err
	}
	if low.IsZero() {
		return low, nil
	}
	return low.Add(-d.cfg.RecoveryMargin), nil
}

// DeleteDelivered implements ferrydriver.Store: it removes events older
// than p.OlderThan and older than what any feed of the partition may still
// need for a recovery scan, at most p.Limit.
func (d *Driver) DeleteDelivered(ctx context.Context, p *ferrydriver.DeleteDeliveredParams) (int64, error) {
	low, err := d.partitionLow(ctx, p.Partition, p.Cursor)
	if err != nil || low.IsZero() {
		return 0, err
	}
	if cut := time.Now().Add(-p.OlderThan); cut.Before(low) {
		low = cut
	}
	limit := int64(p.Limit)
	if limit <= 0 {
		limit = 10000
	}
	n, err := deleteOldest(ctx, d.outbox, bson.D{{Key: "p", Value: p.Partition}, {Key: "appended_at", Value: bson.D{{Key: "$lt", Value: low}}}},
		bson.D{{Key: "appended_at", Value: 1}}, limit)
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: delete delivered events: %w", err)
	}
	return n, nil
}

// PruneKeys implements ferrydriver.Store: a chunk of the keys collection in
// _id order; a key of the partition goes when it was last appended to more
// than p.IdleFor ago and none of its events is left in the outbox (they
// were all delivered and removed by retention: the recovery scan orders a
// key's events by Seq, so a restarted key must not meet its old events
// there). The outbox is asked once per chunk, by the (p, key, seq) index;
// each key is deleted only if its sequence is still the one read. A writer
// whose transaction changes the key meanwhile makes the delete wait for it
// and then match nothing; one whose transaction read the key before the
// delete and writes it after aborts with a write conflict
// (TransientTransactionError) and runs again, creating the key afresh.
func (d *Driver) PruneKeys(ctx context.Context, p *ferrydriver.PruneKeysParams) (*ferrydriver.PruneKeysResult, error) {
	limit := int64(p.Limit)
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	cur, err := d.keys.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$gt", Value: p.After}}}},
		options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: prune idle keys: %w", err)
	}
	var chunk []struct {
		Key     string    `bson:"_id"`
		Seq     int64     `bson:"seq"`
		Touched time.Time `bson:"touched_at"`
	}
	if err := cur.All(ctx, &chunk); err != nil {
		return nil, fmt.Errorf("ferrymongo: prune idle keys: %w", err)
	}
	res := &ferrydriver.PruneKeysResult{}
	if int64(len(chunk)) == limit {
		res.Next = chunk[len(chunk)-1].Key
	}
	cut := time.Now().Add(-p.IdleFor)
	seqs := map[string]int64{}
	var idle bson.A
	for _, k := range chunk {
		// Keys written before touched_at was recorded count as idle: the
		// outbox check decides.
		if d.PartitionOf(k.Key) == p.Partition && k.Touched.Before(cut) {
			seqs[k.Key] = k.Seq
			idle = append(idle, k.Key)
		}
	}
	if len(idle) == 0 {
		return res, nil
	}
	var live []string
	if err := d.outbox.Distinct(ctx, "key", bson.D{{Key: "p", Value: p.Partition}, {Key: "key", Value: bson.D{{Key: "$in", Value: idle}}}}).Decode(&live); err != nil {
		return nil, fmt.Errorf("ferrymongo: prune idle keys: %w", err)
	}
	for _, k := range live {
		delete(seqs, k)
	}
	if len(seqs) == 0 {
		return res, nil
	}
	models := make([]mongo.WriteModel, 0, len(seqs))
	for _, k := range idle {
		if seq, ok := seqs[k.(string)]; ok {
			models = append(models, mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: k}, {Key: "seq", Value: seq}}))
		}
	}
	bw, err := d.keys.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: prune idle keys: %w", err)
	}
	res.Pruned = bw.DeletedCount
	return res, nil
}

// DeleteDeadLetters implements ferrydriver.Store: the oldest of a feed's
// expired dead letters, by the (feed, failed_at) index.
func (d *Driver) DeleteDeadLetters(ctx context.Context, p *ferrydriver.DeleteDeadLettersParams) (int64, error) {
	limit := int64(p.Limit)
	if limit <= 0 {
		limit = 10000
	}
	n, err := deleteOldest(ctx, d.deadLetters, bson.D{{Key: "feed", Value: p.Feed}, {Key: "failed_at", Value: bson.D{{Key: "$lt", Value: time.Now().Add(-p.OlderThan)}}}},
		bson.D{{Key: "failed_at", Value: 1}}, limit)
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: delete old dead letters of %s: %w", p.Feed, err)
	}
	return n, nil
}

// FeedLag implements ferrydriver.Store. Positions are append times: the
// first ferrydriver.ExactCountLimit events appended after the last
// acknowledged one are counted, and their density in time is extrapolated
// up to the partition's newest append, both by the (p, appended_at)
// index. Approximate even when exact: append times come from the
// producers' clocks, with millisecond precision.
func (d *Driver) FeedLag(ctx context.Context, p *ferrydriver.FeedLagParams) (*ferrydriver.FeedLag, error) {
	st, err := d.checkpointStatus(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	return d.feedLag(ctx, p.Feed, p.Partition, st)
}

func (d *Driver) feedLag(ctx context.Context, feed string, partition int, st *ferrydriver.FeedStatus) (*ferrydriver.FeedLag, error) {
	c, err := decodeCursor(st.Checkpoint.Cursor)
	if err != nil {
		return nil, err
	}
	lag := &ferrydriver.FeedLag{Now: st.Now}
	filter := bson.D{{Key: "p", Value: partition}, {Key: "appended_at", Value: bson.D{{Key: "$gt", Value: c.At}}}}
	cur, err := d.outbox.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: filter}},
		{{Key: "$sort", Value: bson.D{{Key: "appended_at", Value: 1}}}},
		{{Key: "$limit", Value: ferrydriver.ExactCountLimit}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
			{Key: "first", Value: bson.D{{Key: "$min", Value: "$appended_at"}}}, {Key: "last", Value: bson.D{{Key: "$max", Value: "$appended_at"}}},
			{Key: "oldest", Value: bson.D{{Key: "$min", Value: "$created_at"}}}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: measure lag of %s: %w", feed, err)
	}
	var sample []struct {
		N      int64     `bson:"n"`
		First  time.Time `bson:"first"`
		Last   time.Time `bson:"last"`
		Oldest time.Time `bson:"oldest"`
	}
	if err := cur.All(ctx, &sample); err != nil {
		return nil, fmt.Errorf("ferrymongo: measure lag of %s: %w", feed, err)
	}
	if len(sample) == 0 {
		return lag, nil
	}
	s := sample[0]
	lag.Events, lag.OldestPending = s.N, s.Oldest
	if s.N < ferrydriver.ExactCountLimit {
		return lag, nil
	}
	var newest struct {
		At time.Time `bson:"appended_at"`
	}
	err = d.outbox.FindOne(ctx, bson.D{{Key: "p", Value: partition}},
		options.FindOne().SetSort(bson.D{{Key: "appended_at", Value: -1}}).SetProjection(bson.D{{Key: "appended_at", Value: 1}, {Key: "_id", Value: 0}})).Decode(&newest)
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: measure lag of %s: %w", feed, err)
	}
	// The sample's first append stands for the checkpoint's position: the
	// two clocks need not agree.
	from := float64(s.First.UnixMicro() - 1)
	lag.Events, lag.Estimated = driverkit.ExtrapolateLag(s.N, from, float64(s.Last.UnixMicro()), float64(newest.At.UnixMicro()))
	return lag, nil
}

// ListFeeds implements ferrydriver.Store: the distinct names of the
// checkpoints and leases, and the distinct feeds of the dead letters and
// the parked events (each by an index that leads with the feed).
func (d *Driver) ListFeeds(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	for _, src := range []struct {
		coll  *mongo.Collection
		field string
	}{{d.checkpoints, "_id"}, {d.leases, "_id"}, {d.deadLetters, "feed"}, {d.parked(), "feed"}} {
		var names []string
		if err := src.coll.Distinct(ctx, src.field, bson.D{}).Decode(&names); err != nil {
			return nil, fmt.Errorf("ferrymongo: list feeds (%s): %w", src.coll.Name(), err)
		}
		for _, n := range names {
			seen[n] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// FeedStatus implements ferrydriver.Store. Lag counts the partition's
// events appended after the last acknowledged one: approximate, since
// append times come from the producers' clocks (and have millisecond
// precision); without Exact, it is FeedLag's.
func (d *Driver) FeedStatus(ctx context.Context, p *ferrydriver.FeedStatusParams) (*ferrydriver.FeedStatus, error) {
	st, err := d.checkpointStatus(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	if !p.Exact {
		lag, err := d.feedLag(ctx, p.Feed, p.Partition, st)
		if err != nil {
			return nil, err
		}
		st.LagEvents, st.LagEstimated, st.OldestPending = lag.Events, lag.Estimated, lag.OldestPending
		return st, d.countDeadLetters(ctx, st, false)
	}
	c, err := decodeCursor(st.Checkpoint.Cursor)
	if err != nil {
		return nil, err
	}
	filter := bson.D{{Key: "p", Value: p.Partition}, {Key: "appended_at", Value: bson.D{{Key: "$gt", Value: c.At}}}}
	if st.LagEvents, err = d.outbox.CountDocuments(ctx, filter); err != nil {
		return nil, fmt.Errorf("ferrymongo: measure lag of %s: %w", p.Feed, err)
	}
	var oldest outboxDoc
	err = d.outbox.FindOne(ctx, filter, options.FindOne().SetSort(bson.D{{Key: "appended_at", Value: 1}})).Decode(&oldest)
	if err == nil {
		st.OldestPending = oldest.CreatedAt
	} else if !errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("ferrymongo: measure lag of %s: %w", p.Feed, err)
	}
	return st, d.countDeadLetters(ctx, st, true)
}

// countDeadLetters counts the feed's dead letters into st: all of them
// when exact, else at most ferrydriver.ExactCountLimit+1.
func (d *Driver) countDeadLetters(ctx context.Context, st *ferrydriver.FeedStatus, exact bool) error {
	opts := options.Count()
	if !exact {
		opts.SetLimit(ferrydriver.ExactCountLimit + 1)
	}
	n, err := d.deadLetters.CountDocuments(ctx, bson.D{{Key: "feed", Value: st.Feed}}, opts)
	if err != nil {
		return fmt.Errorf("ferrymongo: count dead letters of %s: %w", st.Feed, err)
	}
	st.DeadLetters = n
	if !exact && n > ferrydriver.ExactCountLimit {
		st.DeadLetters, st.DeadLettersMore = ferrydriver.ExactCountLimit, true
	}
	return nil
}

// checkpointStatus is the part of a feed's status every feed kind has: its
// checkpoint, its lease, and the database's time (the lease's, if any).
func (d *Driver) checkpointStatus(ctx context.Context, feed string) (*ferrydriver.FeedStatus, error) {
	st := &ferrydriver.FeedStatus{Feed: feed, Now: time.Now().UTC()}
	cp, err := d.LoadCheckpoint(ctx, &ferrydriver.LoadCheckpointParams{Feed: feed})
	if err != nil {
		return nil, err
	}
	st.Checkpoint = cp
	if l, err := d.GetLease(ctx, feed); err == nil {
		st.Lease, st.Now = l, l.Now
	} else if !errors.Is(err, ferrydriver.ErrNotFound) {
		return nil, err
	}
	return st, nil
}

// OplogWindow is how far back the oplog reaches now: the time between its
// oldest and newest entries. It needs read access to local.oplog.rs.
func (d *Driver) OplogWindow(ctx context.Context) (time.Duration, error) {
	oplog := d.client.Database("local").Collection("oplog.rs")
	var first, last struct {
		TS bson.Timestamp `bson:"ts"`
	}
	proj := options.FindOne().SetProjection(bson.D{{Key: "ts", Value: 1}})
	if err := oplog.FindOne(ctx, bson.D{}, proj.SetSort(bson.D{{Key: "$natural", Value: 1}})).Decode(&first); err != nil {
		return 0, fmt.Errorf("ferrymongo: read the oldest oplog entry (needs read access to local.oplog.rs): %w", err)
	}
	proj = options.FindOne().SetProjection(bson.D{{Key: "ts", Value: 1}})
	if err := oplog.FindOne(ctx, bson.D{}, proj.SetSort(bson.D{{Key: "$natural", Value: -1}})).Decode(&last); err != nil {
		return 0, fmt.Errorf("ferrymongo: read the newest oplog entry: %w", err)
	}
	return time.Duration(int64(last.TS.T)-int64(first.TS.T)) * time.Second, nil
}

// CheckRetention returns a warning when published events are kept for
// less than the oplog window plus Config.OutageAllowance (see
// retentionCheck), or "" when retention is long enough. retention is the
// relay's; Config.RetentionTTL, when shorter, is what counts.
func (d *Driver) CheckRetention(ctx context.Context, retention time.Duration) (string, error) {
	window, err := d.OplogWindow(ctx)
	if err != nil {
		return "", err
	}
	return retentionCheck(effectiveRetention(retention, d.cfg.RetentionTTL), window, d.cfg.OutageAllowance), nil
}

// effectiveRetention is the shorter of the relay's retention and the TTL
// index's, ignoring whichever is off (0).
func effectiveRetention(relay, ttl time.Duration) time.Duration {
	switch {
	case relay <= 0:
		return ttl
	case ttl <= 0:
		return relay
	}
	return min(relay, ttl)
}
