package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// parked holds the events the relay set aside for stuck keys: one document
// per (feed, event), ordered per key by pos, a counter per feed drawn in
// the fenced transaction that parks them.
func (d *Driver) parked() *mongo.Collection { return d.coll("parked") }

type parkedDoc struct {
	Feed     string    `bson:"feed"`
	Key      string    `bson:"key"`
	Pos      int64     `bson:"pos"`
	Event    outboxDoc `bson:"event"`
	ParkedAt time.Time `bson:"parked_at"`
	Held     bool      `bson:"held"`
	Reason   string    `bson:"reason"`
	Queued   int64     `bson:"queued,omitempty"`
	// Redriven: an operator redrove it (RedriveDeadLetters); the feed's
	// relay finds such keys through the partial index on it.
	Redriven bool `bson:"redriven,omitempty"`
	// Attempts and FirstFailure: the head's failed attempts to publish it
	// (SetParkedAttempts), reset by ReleaseParked.
	Attempts     int       `bson:"attempts,omitempty"`
	FirstFailure time.Time `bson:"first_failure,omitempty"`
}

func parkedID(feed, eventID string) bson.D {
	return bson.D{{Key: "feed", Value: feed}, {Key: "event", Value: eventID}}
}

func (d *Driver) eventDoc(ev *ferryevent.Event) outboxDoc {
	doc := outboxDoc{ID: ev.ID.String(), Partition: d.PartitionOf(ev.Key), Topic: ev.Topic, Key: ev.Key, Seq: ev.Seq, Type: ev.Type,
		Source: ev.Source, ContentType: ev.ContentType, Headers: ev.Headers, Payload: ev.Payload, Created: created(ev.CreatedAt)}
	if doc.Payload == nil {
		doc.Payload = []byte{}
	}
	return doc
}

// ParkEvents implements ferrydriver.Store.
func (d *Driver) ParkEvents(ctx context.Context, p *ferrydriver.ParkEventsParams) error {
	if len(p.Events) == 0 {
		return nil
	}
	return d.fenced(ctx, p.Feed, p.Holder, p.Term, "park events of "+p.Feed, func(tx context.Context) error {
		var counter struct {
			N int64 `bson:"n"`
		}
		if err := d.counters().FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: "parked:" + p.Feed}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int64(len(p.Events))}}}},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&counter); err != nil {
			return fmt.Errorf("ferrymongo: park events of %s: %w", p.Feed, err)
		}
		pos := counter.N - int64(len(p.Events))
		now := time.Now().UTC()
		for _, ev := range p.Events {
			pos++
			doc := parkedDoc{Feed: p.Feed, Key: ev.Key, Pos: pos, Event: d.eventDoc(ev), ParkedAt: now, Reason: p.Reason}
			// Parking an event again (a redelivered read) keeps the first.
			if _, err := d.parked().UpdateOne(tx, bson.D{{Key: "_id", Value: parkedID(p.Feed, ev.ID.String())}},
				bson.D{{Key: "$setOnInsert", Value: doc}}, options.UpdateOne().SetUpsert(true)); err != nil {
				return fmt.Errorf("ferrymongo: park event %s: %w", ev.ID, err)
			}
		}
		return nil
	})
}

func (pd *parkedDoc) event() (*ferrydriver.ParkedEvent, error) {
	ev, err := pd.Event.event()
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: parked event %s: %w", pd.Event.ID, err)
	}
	return &ferrydriver.ParkedEvent{Feed: pd.Feed, Event: *ev, ParkedAt: pd.ParkedAt, Held: pd.Held, Reason: pd.Reason, Queued: pd.Queued, Redriven: pd.Redriven,
		Attempts: pd.Attempts, FirstFailure: pd.FirstFailure}, nil
}

// ParkedHeads implements ferrydriver.Store. With keys, one index probe
// ({feed, key, pos}) per key; for the keys with redriven events, their
// distinct keys through the partial index on them first; without, an
// aggregation over the feed's parked documents.
func (d *Driver) ParkedHeads(ctx context.Context, p *ferrydriver.ParkedHeadsParams) ([]*ferrydriver.ParkedEvent, error) {
	var out []*ferrydriver.ParkedEvent
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	keys := p.Keys
	if keys == nil && p.Redriven {
		keys = []string{}
		if err := d.parked().Distinct(ctx, "key", bson.D{{Key: "feed", Value: p.Feed}, {Key: "redriven", Value: true}}).Decode(&keys); err != nil {
			return nil, fmt.Errorf("ferrymongo: read redriven events of %s: %w", p.Feed, err)
		}
		keys = keys[:min(len(keys), limit)]
	}
	if keys != nil {
		for _, key := range keys {
			var doc parkedDoc
			err := d.parked().FindOne(ctx, bson.D{{Key: "feed", Value: p.Feed}, {Key: "key", Value: key}},
				options.FindOne().SetSort(bson.D{{Key: "pos", Value: 1}})).Decode(&doc)
			if errors.Is(err, mongo.ErrNoDocuments) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("ferrymongo: read parked events of %s: %w", p.Feed, err)
			}
			pe, err := doc.event()
			if err != nil {
				return nil, err
			}
			out = append(out, pe)
		}
		return out, nil
	}
	cur, err := d.parked().Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "feed", Value: p.Feed}}}},
		{{Key: "$sort", Value: bson.D{{Key: "key", Value: 1}, {Key: "pos", Value: 1}}}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$key"}, {Key: "head", Value: bson.D{{Key: "$first", Value: "$$ROOT"}}}, {Key: "queued", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
		{{Key: "$replaceWith", Value: bson.D{{Key: "$mergeObjects", Value: bson.A{"$head", bson.D{{Key: "queued", Value: "$queued"}}}}}}},
		{{Key: "$sort", Value: bson.D{{Key: "parked_at", Value: 1}, {Key: "key", Value: 1}}}},
		{{Key: "$limit", Value: limit}},
	})
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: read parked events of %s: %w", p.Feed, err)
	}
	defer cur.Close(ctx)
	for cur.Next(ctx) {
		var doc parkedDoc
		if err := cur.Decode(&doc); err != nil {
			return nil, fmt.Errorf("ferrymongo: read parked events of %s: %w", p.Feed, err)
		}
		pe, err := doc.event()
		if err != nil {
			return nil, err
		}
		out = append(out, pe)
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("ferrymongo: read parked events of %s: %w", p.Feed, err)
	}
	return out, nil
}

// deadLetterParked moves a parked document into the dead letters, in tx.
func (d *Driver) deadLetterParked(tx context.Context, doc *parkedDoc, reason string) error {
	id := bson.D{{Key: "feed", Value: doc.Feed}, {Key: "event", Value: doc.Event.ID}}
	if _, err := d.deadLetters.UpdateOne(tx, bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$setOnInsert", Value: bson.D{{Key: "feed", Value: doc.Feed}, {Key: "event", Value: doc.Event},
			{Key: "reason", Value: reason}, {Key: "failed_at", Value: time.Now().UTC()}}}},
		options.UpdateOne().SetUpsert(true)); err != nil {
		return fmt.Errorf("ferrymongo: dead-letter parked event %s: %w", doc.Event.ID, err)
	}
	return nil
}

// UnparkEvent implements ferrydriver.Store.
func (d *Driver) UnparkEvent(ctx context.Context, p *ferrydriver.UnparkEventParams) error {
	return d.fenced(ctx, p.Feed, p.Holder, p.Term, "unpark an event of "+p.Feed, func(tx context.Context) error {
		var doc parkedDoc
		err := d.parked().FindOneAndDelete(tx, bson.D{{Key: "_id", Value: parkedID(p.Feed, p.EventID.String())}}).Decode(&doc)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("ferrymongo: unpark event %s: %w", p.EventID, err)
		}
		if p.DeadLetter != nil {
			return d.deadLetterParked(tx, &doc, p.DeadLetter.Reason)
		}
		return nil
	})
}

// HoldParked implements ferrydriver.Store.
func (d *Driver) HoldParked(ctx context.Context, p *ferrydriver.HoldParkedParams) error {
	return d.fenced(ctx, p.Feed, p.Holder, p.Term, "hold a parked key of "+p.Feed, func(tx context.Context) error {
		_, err := d.parked().UpdateOne(tx, bson.D{{Key: "_id", Value: parkedID(p.Feed, p.EventID.String())}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "held", Value: true}, {Key: "reason", Value: p.Reason}}}})
		if err != nil {
			return fmt.Errorf("ferrymongo: hold parked key %s: %w", p.Key, err)
		}
		return nil
	})
}

// SetParkedAttempts implements ferrydriver.Store.
func (d *Driver) SetParkedAttempts(ctx context.Context, p *ferrydriver.SetParkedAttemptsParams) error {
	return d.fenced(ctx, p.Feed, p.Holder, p.Term, "record the attempts of a parked key of "+p.Feed, func(tx context.Context) error {
		set := bson.D{{Key: "attempts", Value: p.Attempts}}
		var unset bson.D
		if p.FirstFailure.IsZero() {
			unset = bson.D{{Key: "first_failure", Value: ""}}
		} else {
			set = append(set, bson.E{Key: "first_failure", Value: p.FirstFailure.UTC()})
		}
		update := bson.D{{Key: "$set", Value: set}}
		if unset != nil {
			update = append(update, bson.E{Key: "$unset", Value: unset})
		}
		if _, err := d.parked().UpdateOne(tx, bson.D{{Key: "_id", Value: parkedID(p.Feed, p.EventID.String())}}, update); err != nil {
			return fmt.Errorf("ferrymongo: record the attempts of parked key %s: %w", p.Key, err)
		}
		return nil
	})
}

// ReleaseParked implements ferrydriver.Store.
func (d *Driver) ReleaseParked(ctx context.Context, p *ferrydriver.ReleaseParkedParams) error {
	return d.inTx(ctx, func(tx context.Context) error {
		var doc parkedDoc
		err := d.parked().FindOne(tx, bson.D{{Key: "feed", Value: p.Feed}, {Key: "key", Value: p.Key}},
			options.FindOne().SetSort(bson.D{{Key: "pos", Value: 1}})).Decode(&doc)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return fmt.Errorf("ferrymongo: key %q of feed %s has nothing parked: %w", p.Key, p.Feed, ferrydriver.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("ferrymongo: release parked key %s: %w", p.Key, err)
		}
		id := bson.D{{Key: "_id", Value: parkedID(p.Feed, doc.Event.ID)}}
		if !p.Skip {
			if _, err := d.parked().UpdateOne(tx, id, bson.D{{Key: "$set", Value: bson.D{{Key: "held", Value: false}}},
				{Key: "$unset", Value: bson.D{{Key: "attempts", Value: ""}, {Key: "first_failure", Value: ""}}}}); err != nil {
				return fmt.Errorf("ferrymongo: release parked key %s: %w", p.Key, err)
			}
			return nil
		}
		if err := d.deadLetterParked(tx, &doc, "skipped by an operator after: "+doc.Reason); err != nil {
			return err
		}
		if _, err := d.parked().DeleteOne(tx, id); err != nil {
			return fmt.Errorf("ferrymongo: release parked key %s: %w", p.Key, err)
		}
		return nil
	})
}
