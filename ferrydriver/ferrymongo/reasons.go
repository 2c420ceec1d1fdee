package ferrymongo

import (
	"context"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// DeadLetterReasons implements ferrydriver.Admin: the newest
// p.Scan dead letters (of p.Feed when set), read through the failed_at
// index (the feed's, for one feed: a sort by failed_at alone, which an
// index serves, not a sort of every dead letter), grouped by feed
// partition and reason by the server.
func (d *Driver) DeadLetterReasons(ctx context.Context, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	match := deadLetterFilter(&ferrydriver.ListDeadLettersParams{Feed: p.Feed})
	return d.reasons(ctx, "group dead letters by reason", d.deadLetters, match,
		bson.D{{Key: "failed_at", Value: -1}}, "$feed", "$reason", "$failed_at", "$event._id", p)
}

// InboxDeadReasons implements ferrydriver.Admin: the newest
// p.Scan DEAD rows of p.Group, through the (g, state, finished_at) index.
func (d *Driver) InboxDeadReasons(ctx context.Context, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	match := bson.D{{Key: "g", Value: p.Group}, {Key: "state", Value: string(ferrydriver.InboxDead)}}
	return d.reasons(ctx, "group dead events by reason", d.inbox(), match,
		bson.D{{Key: "finished_at", Value: -1}}, bson.D{{Key: "$literal", Value: ""}}, bson.D{{Key: "$ifNull", Value: bson.A{"$last_error", ""}}},
		"$finished_at", "$_id.e", p)
}

// reasons groups the newest p.Scan documents of coll matching match (in
// sort's order) by feed and reason (expressions), keeping their at and id.
func (d *Driver) reasons(ctx context.Context, op string, coll *mongo.Collection, match, sort bson.D, feed, reason, at, id any, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	scan, ids, limit := p.Bounds()
	pipeline := mongo.Pipeline{
		{{Key: "$match", Value: match}},
		{{Key: "$sort", Value: sort}},
		{{Key: "$limit", Value: scan}},
		{{Key: "$project", Value: bson.D{{Key: "f", Value: feed}, {Key: "r", Value: reason}, {Key: "at", Value: at}, {Key: "id", Value: id}}}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "f", Value: "$f"}, {Key: "r", Value: "$r"}}}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
			{Key: "latest", Value: bson.D{{Key: "$max", Value: "$at"}}}, {Key: "ids", Value: bson.D{{Key: "$push", Value: "$id"}}}}}},
		{{Key: "$facet", Value: bson.D{
			{Key: "total", Value: bson.A{bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}, {Key: "n", Value: bson.D{{Key: "$sum", Value: "$n"}}}}}}}},
			{Key: "groups", Value: bson.A{
				bson.D{{Key: "$sort", Value: bson.D{{Key: "n", Value: -1}, {Key: "latest", Value: -1}, {Key: "_id", Value: 1}}}},
				bson.D{{Key: "$limit", Value: limit}},
				// $push kept the scan's order: newest first.
				bson.D{{Key: "$project", Value: bson.D{{Key: "n", Value: 1}, {Key: "latest", Value: 1},
					{Key: "ids", Value: bson.D{{Key: "$slice", Value: bson.A{"$ids", ids}}}}}}},
			}},
		}}},
	}
	cur, err := coll.Aggregate(ctx, pipeline)
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: %s: %w", op, err)
	}
	var res []struct {
		Total []struct {
			N int `bson:"n"`
		} `bson:"total"`
		Groups []struct {
			ID struct {
				Feed   string `bson:"f"`
				Reason string `bson:"r"`
			} `bson:"_id"`
			N      int       `bson:"n"`
			Latest time.Time `bson:"latest"`
			IDs    []string  `bson:"ids"`
		} `bson:"groups"`
	}
	if err := cur.All(ctx, &res); err != nil {
		return nil, fmt.Errorf("ferrymongo: %s: %w", op, err)
	}
	out := &ferrydriver.Reasons{}
	if len(res) == 0 {
		return out, nil
	}
	if len(res[0].Total) > 0 {
		out.Scanned = res[0].Total[0].N
	}
	for _, g := range res[0].Groups {
		evs, err := driverkit.ParseIDs(g.IDs)
		if err != nil {
			return nil, fmt.Errorf("ferrymongo: %s: %w", op, err)
		}
		out.Groups = append(out.Groups, ferrydriver.ReasonGroup{Feed: g.ID.Feed, Reason: g.ID.Reason, Count: g.N, Latest: g.Latest.UTC(), EventIDs: evs})
	}
	return out, nil
}
