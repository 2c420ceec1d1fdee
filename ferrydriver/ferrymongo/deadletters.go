package ferrymongo

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

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
			doc := d.eventDoc(ev)
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
func (d *Driver) RedriveDeadLetters(ctx context.Context, refs []ferrydriver.DeadLetterRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	var n int
	err := d.inTx(ctx, func(tx context.Context) error {
		n = 0
		cur, err := d.deadLetters.Find(tx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: refIDs(refs)}}}},
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
func (d *Driver) DiscardDeadLetters(ctx context.Context, refs []ferrydriver.DeadLetterRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	res, err := d.deadLetters.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: refIDs(refs)}}}})
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
func (d *Driver) GetDeadLetter(ctx context.Context, p ferrydriver.DeadLetterRef) (*ferrydriver.DeadLetter, error) {
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
