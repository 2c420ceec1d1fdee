package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Leases use the server's clock ($$NOW), never the relays' own.

func expr(op string, args ...any) bson.D { return bson.D{{Key: op, Value: bson.A(args)}} }

// literal keeps a user's string from being read as a field path ("$x")
// or a variable ("$$x") inside an aggregation expression.
func literal(v any) bson.D { return bson.D{{Key: "$literal", Value: v}} }

func cond(ifExpr, then, otherwise any) bson.D {
	return bson.D{{Key: "$cond", Value: bson.A{ifExpr, then, otherwise}}}
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
		st.OldestPending = oldest.Created.time()
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
	cp, err := d.LoadCheckpoint(ctx, feed)
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
