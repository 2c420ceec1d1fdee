package ferrymongo

import (
	"context"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// InboxStates implements ferrydriver.Settler, reading outside any session.
func (d *Driver) InboxStates(ctx context.Context, p *ferrydriver.InboxIDsParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	out := make(map[uuid.UUID]*ferrydriver.InboxRow, len(p.EventIDs))
	if len(p.EventIDs) == 0 {
		return out, nil
	}
	ids := bson.A{}
	for _, id := range p.EventIDs {
		ids = append(ids, rowID(p.Group, id))
	}
	cur, err := d.inbox().Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: read inbox states of group %s: %w", p.Group, err)
	}
	rows, err := d.rows(ctx, p.Group, cur)
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: read inbox states of group %s: %w", p.Group, err)
	}
	for _, r := range rows {
		out[r.Event.ID] = r
	}
	return out, nil
}

// AwaitSettled implements ferrydriver.Settler with a change stream on the
// inbox: it opens the stream first (so that nothing finishing afterwards
// is missed), reads the events' states once, then waits for the stream to
// report changes of the awaited rows; it never polls.
func (d *Driver) AwaitSettled(ctx context.Context, p *ferrydriver.AwaitSettledParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	wctx, cancel := context.WithDeadline(ctx, p.Deadline)
	defer cancel()
	ids := bson.A{}
	for _, id := range p.EventIDs {
		ids = append(ids, id.String())
	}
	pipeline := mongo.Pipeline{{{Key: "$match", Value: bson.D{
		{Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"update", "replace", "insert"}}}},
		{Key: "documentKey._id.g", Value: p.Group},
		{Key: "documentKey._id.e", Value: bson.D{{Key: "$in", Value: ids}}},
	}}}}
	// Read the states first, in a causally consistent session, then watch
	// from that read's operation time: a change after the read is in the
	// stream, one before it is in the read.
	sess, err := d.client.StartSession(options.Session().SetCausalConsistency(true))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: start session: %w", err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	states, err := d.InboxStates(mongo.NewSessionContext(wctx, sess), &ferrydriver.InboxIDsParams{Group: p.Group, EventIDs: p.EventIDs})
	if err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			return map[uuid.UUID]*ferrydriver.InboxRow{}, nil // past the deadline: all pending
		}
		return nil, err
	}
	// The driver refuses to wait longer than the context allows: keep
	// each wait well inside the deadline.
	maxAwait := min(time.Second, time.Until(p.Deadline)/2)
	if maxAwait <= 0 {
		return states, nil
	}
	opts := options.ChangeStream().SetMaxAwaitTime(maxAwait)
	if t := sess.OperationTime(); t != nil {
		opts.SetStartAtOperationTime(t)
	}
	cs, err := d.inbox().Watch(wctx, pipeline, opts)
	if err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			return states, nil
		}
		return nil, fmt.Errorf("ferrymongo: watch the inbox for settlement: %w", err)
	}
	defer cs.Close(context.WithoutCancel(ctx))
	pending := map[uuid.UUID]bool{}
	for _, id := range p.EventIDs {
		if r, ok := states[id]; !ok || !r.State.Finished() {
			pending[id] = true
		}
	}
	for len(pending) > 0 && cs.Next(wctx) {
		var change struct {
			Key struct {
				ID inboxID `bson:"_id"`
			} `bson:"documentKey"`
		}
		if err := cs.Decode(&change); err != nil {
			return nil, fmt.Errorf("ferrymongo: decode an inbox change: %w", err)
		}
		id, err := uuid.Parse(change.Key.ID.Event)
		if err != nil || !pending[id] {
			continue
		}
		fresh, err := d.InboxStates(wctx, &ferrydriver.InboxIDsParams{Group: p.Group, EventIDs: []uuid.UUID{id}})
		if err != nil {
			if wctx.Err() != nil {
				break // the deadline: what is left is pending
			}
			return nil, err
		}
		if r, ok := fresh[id]; ok {
			states[id] = r
			if r.State.Finished() {
				delete(pending, id)
			}
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err := cs.Err(); err != nil && wctx.Err() == nil && time.Until(p.Deadline) > maxAwait {
		return nil, fmt.Errorf("ferrymongo: watch the inbox for settlement: %w", err)
	}
	return states, nil
}
