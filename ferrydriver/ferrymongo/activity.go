package ferrymongo

import (
	"context"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func (d *Driver) activity() *mongo.Collection { return d.coll("activity") }

// activityDoc is one ferrydriver.ActivitySample; durations in seconds.
type activityDoc struct {
	Kind       string    `bson:"kind"`
	Name       string    `bson:"name"`
	Process    string    `bson:"process"`
	At         time.Time `bson:"at"`
	Seconds    float64   `bson:"seconds"`
	Done       int64     `bson:"done"`
	Failed     int64     `bson:"failed"`
	Dead       int64     `bson:"dead"`
	LatencyP50 float64   `bson:"latency_p50"`
	LatencyP99 float64   `bson:"latency_p99"`
	HandlerP50 float64   `bson:"handler_p50"`
	HandlerP99 float64   `bson:"handler_p99"`
	LagEvents  int64     `bson:"lag_events,omitempty"`
	LagSeconds float64   `bson:"lag_seconds,omitempty"`
}

// RecordActivity implements ferrydriver.Admin. The server
// removes samples a day old (a TTL index on at, DefaultActivityRetention);
// p.Retention does not change that.
func (d *Driver) RecordActivity(ctx context.Context, p *ferrydriver.RecordActivityParams) error {
	if len(p.Samples) == 0 {
		return nil
	}
	docs := make([]any, len(p.Samples))
	for i, s := range p.Samples {
		docs[i] = activityDoc{Kind: s.Kind, Name: s.Name, Process: s.Process, At: s.At.UTC(), Seconds: s.Interval.Seconds(),
			Done: s.Done, Failed: s.Failed, Dead: s.Dead, LatencyP50: s.LatencyP50.Seconds(), LatencyP99: s.LatencyP99.Seconds(),
			HandlerP50: s.HandlerP50.Seconds(), HandlerP99: s.HandlerP99.Seconds(), LagEvents: s.LagEvents, LagSeconds: s.LagAge.Seconds()}
	}
	if _, err := d.activity().InsertMany(ctx, docs, options.InsertMany().SetOrdered(false)); err != nil {
		return fmt.Errorf("ferrymongo: record activity: %w", err)
	}
	return nil
}

// ListActivity implements ferrydriver.Admin.
func (d *Driver) ListActivity(ctx context.Context, p *ferrydriver.ListActivityParams) ([]*ferrydriver.ActivitySample, error) {
	limit := p.Limit
	if limit <= 0 || limit > ferrydriver.ActivityListCap {
		limit = ferrydriver.ActivityListCap
	}
	filter := bson.D{{Key: "at", Value: bson.D{{Key: "$gte", Value: p.Since.UTC()}}}}
	if p.Kind != "" {
		filter = append(filter, bson.E{Key: "kind", Value: p.Kind})
	}
	if p.Name != "" {
		filter = append(filter, bson.E{Key: "name", Value: p.Name})
	}
	cur, err := d.activity().Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "at", Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: list activity: %w", err)
	}
	var docs []activityDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("ferrymongo: list activity: %w", err)
	}
	out := make([]*ferrydriver.ActivitySample, len(docs))
	for i, doc := range docs {
		sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
		out[i] = &ferrydriver.ActivitySample{Kind: doc.Kind, Name: doc.Name, Process: doc.Process, At: doc.At, Interval: sec(doc.Seconds),
			Done: doc.Done, Failed: doc.Failed, Dead: doc.Dead, LatencyP50: sec(doc.LatencyP50), LatencyP99: sec(doc.LatencyP99),
			HandlerP50: sec(doc.HandlerP50), HandlerP99: sec(doc.HandlerP99), LagEvents: doc.LagEvents, LagAge: sec(doc.LagSeconds)}
	}
	return out, nil
}
