package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

type leaseDoc struct {
	Holder    string    `bson:"holder"`
	Term      int64     `bson:"term"`
	ExpiresAt time.Time `bson:"expires_at"`
	Now       time.Time `bson:"now"`
}

func (l *leaseDoc) lease(name string) *ferrydriver.Lease {
	return &ferrydriver.Lease{Name: name, Holder: l.Holder, Term: l.Term, ExpiresAt: l.ExpiresAt, Now: l.Now}
}

// AcquireLease implements ferrydriver.Store in one atomic update: the
// lease is taken if free or expired (term + 1), renewed if held by holder
// (same term), left alone otherwise; the document as it now stands comes
// back with the server's clock.
func (d *Driver) AcquireLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error) {
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
func (d *Driver) RenewLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error) {
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
func (d *Driver) ReleaseLease(ctx context.Context, p *ferrydriver.LeaseParams) error {
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
func (d *Driver) LoadCheckpoint(ctx context.Context, feed string) (*ferrydriver.Checkpoint, error) {
	cp := &ferrydriver.Checkpoint{Feed: feed}
	var doc checkpointDoc
	err := d.checkpoints.FindOne(ctx, bson.D{{Key: "_id", Value: feed}}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return cp, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: load checkpoint of %s: %w", feed, err)
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
