package ferrymongo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Image modes for CaptureConfig.PostImage and PreImage, as the server
// names them.
const (
	// ImageOff leaves the image out (the default).
	ImageOff = ""
	// ImageUpdateLookup (post-image only) reads the document's current
	// version when the change is read: it can be newer than the change.
	ImageUpdateLookup = "updateLookup"
	// ImageWhenAvailable uses the image the server recorded at the change,
	// when there is one (MongoDB 6.0+, changeStreamPreAndPostImages on the
	// collection).
	ImageWhenAvailable = "whenAvailable"
	// ImageRequired is ImageWhenAvailable, but the stream fails when an
	// image is missing.
	ImageRequired = "required"
)

// CaptureConfig configures the non-outbox mode: relaying the changes of
// business collections directly, without an outbox written in the same
// transaction. Off by default; see Capture for what it gives up.
type CaptureConfig struct {
	// Collections are the collections to capture, all through one
	// database-level change stream. Empty: every collection of the database
	// except Ferry's own (those starting with Config.Prefix).
	Collections []string
	// Operations are the change types relayed. Default insert, update,
	// replace and delete.
	Operations []string
	// PostImage is how an update carries the document after it: ImageOff
	// (only the update description), ImageUpdateLookup, ImageWhenAvailable
	// or ImageRequired. Inserts and replaces always carry it.
	PostImage string
	// PreImage is how updates, replaces and deletes carry the document
	// before them: ImageOff, ImageWhenAvailable or ImageRequired (MongoDB
	// 6.0+; see Capture.EnableImages).
	PreImage string
	// Topic names an event's topic after its collection. Default: the
	// collection name.
	Topic func(collection string) string
	// StartAt is where a feed with no saved position starts. Default: when
	// it first opens (changes made before are not relayed).
	StartAt time.Time
	// ResumeFromNowOnHistoryLost lets a feed whose position the oplog no
	// longer holds go on from the present, skipping the changes in between
	// (logged as an error with the gap). Off: the feed stops and says so.
	// Capture mode has no outbox to recover from.
	ResumeFromNowOnHistoryLost bool
}

// Capture is a Store whose feed relays the changes of business collections
// (Debezium-style change data capture) instead of the outbox. It shares the
// Driver's leases, checkpoints and dead letters; give its relay a feed name
// of its own (RelayConfig.Feed, e.g. "capture").
//
// What it gives up against the outbox: events are shaped by the database
// schema, not chosen by the producer; Seq is 0 (there is no per-key
// sequence; per-key order is still the oplog's); and lost oplog history
// cannot be recovered, since nothing but the oplog recorded the changes.
// Each event's ID is derived from the change's resume token, so a change
// read twice gets the same ID and brokers that deduplicate drop the copy.
type Capture struct {
	*Driver
	cfg CaptureConfig
}

// Capture returns the non-outbox Store over d. It checks the configuration
// only; the stream opens on the feed's first read.
func (d *Driver) Capture(cfg *CaptureConfig) (*Capture, error) {
	c := CaptureConfig{}
	if cfg != nil {
		c = *cfg
		c.Collections = slices.Clone(cfg.Collections)
		c.Operations = slices.Clone(cfg.Operations)
	}
	if len(c.Operations) == 0 {
		c.Operations = []string{"insert", "update", "replace", "delete"}
	}
	for _, op := range c.Operations {
		if !slices.Contains([]string{"insert", "update", "replace", "delete"}, op) {
			return nil, fmt.Errorf("ferrymongo: CaptureConfig.Operations: %q is not a document change; use insert, update, replace or delete", op)
		}
	}
	if !slices.Contains([]string{ImageOff, ImageUpdateLookup, ImageWhenAvailable, ImageRequired}, c.PostImage) {
		return nil, fmt.Errorf("ferrymongo: CaptureConfig.PostImage %q: use \"\" (off), %q, %q or %q", c.PostImage, ImageUpdateLookup, ImageWhenAvailable, ImageRequired)
	}
	if !slices.Contains([]string{ImageOff, ImageWhenAvailable, ImageRequired}, c.PreImage) {
		return nil, fmt.Errorf("ferrymongo: CaptureConfig.PreImage %q: use \"\" (off), %q or %q", c.PreImage, ImageWhenAvailable, ImageRequired)
	}
	for _, name := range c.Collections {
		if strings.HasPrefix(name, d.cfg.Prefix) {
			return nil, fmt.Errorf("ferrymongo: CaptureConfig.Collections: %q is one of Ferry's own collections (prefix %q); relay the outbox with the Driver itself", name, d.cfg.Prefix)
		}
	}
	if c.Topic == nil {
		c.Topic = func(coll string) string { return coll }
	}
	return &Capture{Driver: d, cfg: c}, nil
}

// Name implements ferrydriver.Store.
func (c *Capture) Name() string { return "mongodb-capture" }

// PartitionOf is 0: a capture has one feed.
func (c *Capture) PartitionOf(string) int { return 0 }

// EnableImages turns on changeStreamPreAndPostImages (collMod, MongoDB
// 6.0+) for each of CaptureConfig.Collections, which ImageWhenAvailable
// and ImageRequired need.
func (c *Capture) EnableImages(ctx context.Context) error {
	if len(c.cfg.Collections) == 0 {
		return errors.New("ferrymongo: EnableImages needs CaptureConfig.Collections: name the collections to record images for")
	}
	for _, name := range c.cfg.Collections {
		err := c.db.RunCommand(ctx, bson.D{{Key: "collMod", Value: name},
			{Key: "changeStreamPreAndPostImages", Value: bson.D{{Key: "enabled", Value: true}}}}).Err()
		if err != nil {
			return fmt.Errorf("ferrymongo: enable pre- and post-images on %s (needs MongoDB 6.0+ and the collMod privilege): %w", name, err)
		}
	}
	return nil
}

// DeleteDelivered implements ferrydriver.Store: a capture owns no events
// (the oplog's own size bounds it), so there is nothing to remove.
func (c *Capture) DeleteDelivered(context.Context, *ferrydriver.DeleteDeliveredParams) (int64, error) {
	return 0, nil
}

// FeedStatus implements ferrydriver.Store: checkpoint, lease and dead
// letters; the lag in events is not known without an outbox.
func (c *Capture) FeedStatus(ctx context.Context, p *ferrydriver.FeedStatusParams) (*ferrydriver.FeedStatus, error) {
	st, err := c.checkpointStatus(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	return st, c.countDeadLetters(ctx, st, p.Exact)
}

// PruneKeys implements ferrydriver.Store: a capture has no per-key
// sequences to forget.
func (c *Capture) PruneKeys(context.Context, *ferrydriver.PruneKeysParams) (*ferrydriver.PruneKeysResult, error) {
	return &ferrydriver.PruneKeysResult{}, nil
}

// FeedLag implements ferrydriver.Store: without an outbox the lag in
// events is not known; it is reported as zero.
func (c *Capture) FeedLag(ctx context.Context, p *ferrydriver.FeedLagParams) (*ferrydriver.FeedLag, error) {
	st, err := c.checkpointStatus(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	return &ferrydriver.FeedLag{Now: st.Now}, nil
}

// captureCursor is a capture feed's position: the resume token after the
// last change read, or the cluster time to start at.
type captureCursor struct {
	Capture bool   `json:"capture"`
	Token   []byte `json:"token,omitempty"`
	StartT  uint32 `json:"start_t,omitempty"`
	StartI  uint32 `json:"start_i,omitempty"`
}

// OpenFeed implements ferrydriver.Store.
func (c *Capture) OpenFeed(_ context.Context, p *ferrydriver.OpenFeedParams) (ferrydriver.Feed, error) {
	f := &captureFeed{c: c, name: p.Feed}
	if len(p.Cursor) > 0 {
		if err := json.Unmarshal(p.Cursor, &f.pos); err != nil || !f.pos.Capture {
			return nil, fmt.Errorf("ferrymongo: the saved position of feed %s is not a capture position (was it saved by the outbox feed? give the capture relay a feed name of its own)", p.Feed)
		}
	}
	return f, nil
}

type captureFeed struct {
	c    *Capture
	name string
	pos  captureCursor
	cs   *mongo.ChangeStream
}

// Close implements ferrydriver.Feed.
func (f *captureFeed) Close() error {
	if f.cs == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := f.cs.Close(ctx)
	f.cs = nil
	return err
}

// pipeline is the database-level stream's filter: the chosen operations
// (and invalidate) on the chosen collections. It never drops _id.
func (c *Capture) pipeline() mongo.Pipeline {
	var coll any
	if len(c.cfg.Collections) > 0 {
		coll = bson.D{{Key: "$in", Value: c.cfg.Collections}}
	} else {
		coll = bson.D{{Key: "$not", Value: bson.Regex{Pattern: "^" + regexp.QuoteMeta(c.Driver.cfg.Prefix)}}}
	}
	return mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "operationType", Value: "invalidate"}},
		bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: c.cfg.Operations}}}, {Key: "ns.coll", Value: coll}},
	}}}}}}
}

func (f *captureFeed) open(ctx context.Context) error {
	opts := options.ChangeStream().SetMaxAwaitTime(200 * time.Millisecond)
	if f.c.cfg.PostImage != ImageOff {
		opts.SetFullDocument(options.FullDocument(f.c.cfg.PostImage))
	}
	if f.c.cfg.PreImage != ImageOff {
		opts.SetFullDocumentBeforeChange(options.FullDocument(f.c.cfg.PreImage))
	}
	switch {
	case len(f.pos.Token) > 0:
		opts.SetStartAfter(bson.Raw(f.pos.Token))
	case f.pos.StartT != 0:
		opts.SetStartAtOperationTime(&bson.Timestamp{T: f.pos.StartT, I: f.pos.StartI})
	case !f.c.cfg.StartAt.IsZero():
		opts.SetStartAtOperationTime(&bson.Timestamp{T: uint32(f.c.cfg.StartAt.Unix())})
	}
	cs, err := f.c.db.Watch(ctx, f.c.pipeline(), opts)
	if err != nil {
		return err
	}
	f.cs = cs
	return nil
}

// Read implements ferrydriver.Feed.
func (f *captureFeed) Read(ctx context.Context, p *ferrydriver.ReadParams) (*ferrydriver.Batch, error) {
	if f.cs == nil {
		if err := f.open(ctx); err != nil {
			return f.failed(ctx, err)
		}
	}
	b := &ferrydriver.Batch{}
	token, invalidated, err := readStream(ctx, f.cs, f.pos.Token, max(p.Max, 1), p.Wait,
		func() int { return len(b.Events) + len(b.Invalid) },
		func(raw bson.Raw) error {
			ev, err := f.c.changeEvent(raw)
			if err != nil {
				return err
			}
			if verr := ferryevent.Validate(ev, 0, ferryevent.DefaultMaxPayloadBytes); verr != nil {
				b.Invalid = append(b.Invalid, &ferrydriver.InvalidRecord{Event: *ev, Reason: "change cannot be relayed: " + verr.Error()})
				return nil
			}
			b.Events = append(b.Events, ev)
			return nil
		})
	if err != nil {
		if errors.Is(err, errDecode) {
			return nil, err
		}
		return f.failed(ctx, err)
	}
	if len(token) > 0 {
		f.pos = captureCursor{Capture: true, Token: token}
	}
	f.pos.Capture = true
	if invalidated {
		f.c.Driver.cfg.Logger.Error("ferrymongo: the captured database was dropped or renamed; the capture continues after it", "feed", f.name)
		_ = f.Close()
	}
	b.Cursor, _ = json.Marshal(f.pos)
	return b, nil
}

// failed applies the stream decisions: reopen later, or, when history is
// lost, stop (nothing to recover from) unless the configuration allows
// skipping to the present.
func (f *captureFeed) failed(ctx context.Context, err error) (*ferrydriver.Batch, error) {
	_ = f.Close()
	action, why := decideStreamError(err)
	switch action {
	case streamReopen:
		return nil, fmt.Errorf("ferrymongo: change stream of %s interrupted (%s); it reopens from the last position: %w", f.name, why, err)
	case streamRecover:
		if !f.c.cfg.ResumeFromNowOnHistoryLost {
			return nil, fmt.Errorf("ferrymongo: capture %s cannot go on: %s, and capture mode has no outbox to recover the changes from. "+
				"Grow the oplog (replSetResizeOplog) so that it covers relay outages; to accept the gap and go on from now, "+
				"set CaptureConfig.ResumeFromNowOnHistoryLost (or relay an outbox instead, which recovers): %w", f.name, why, err)
		}
		t, terr := f.c.clusterTime(ctx)
		if terr != nil {
			return nil, terr
		}
		f.c.Driver.cfg.Logger.Error("ferrymongo: capture lost its position; changes in between are NOT relayed",
			"feed", f.name, "reason", why, "err", err, "resumes_at", time.Unix(int64(t.T), 0).UTC())
		f.pos = captureCursor{Capture: true, StartT: t.T, StartI: t.I}
		cur, _ := json.Marshal(f.pos)
		return &ferrydriver.Batch{Cursor: cur}, nil
	}
	return nil, fmt.Errorf("ferrymongo: change stream of %s: %s: %w", f.name, why, err)
}

// captureNamespace derives capture event IDs from resume tokens.
var captureNamespace = uuid.MustParse("5b0f6d3c-6a51-4d7e-9f1c-2a7de1b0c9f3")

// change is the part of a change event a capture reads.
type change struct {
	ID                       bson.Raw                  `bson:"_id"`
	OperationType            string                    `bson:"operationType"`
	NS                       struct{ DB, Coll string } `bson:"ns"`
	DocumentKey              bson.Raw                  `bson:"documentKey"`
	FullDocument             bson.Raw                  `bson:"fullDocument,omitempty"`
	FullDocumentBeforeChange bson.Raw                  `bson:"fullDocumentBeforeChange,omitempty"`
	UpdateDescription        bson.Raw                  `bson:"updateDescription,omitempty"`
	ClusterTime              bson.Timestamp            `bson:"clusterTime"`
	WallTime                 time.Time                 `bson:"wallTime"`
}

// changeEvent turns one change into an event: Topic from the collection,
// Key from the document's _id, Type "mongodb.<operation>", and a JSON
// payload (relaxed Extended JSON) with the operation, namespace, document
// key, images and update description.
func (c *Capture) changeEvent(raw bson.Raw) (*ferryevent.Event, error) {
	var ch change
	if err := bson.Unmarshal(raw, &ch); err != nil {
		return nil, fmt.Errorf("ferrymongo: decode a captured change: %w", err)
	}
	payload := bson.D{{Key: "operationType", Value: ch.OperationType},
		{Key: "ns", Value: bson.D{{Key: "db", Value: ch.NS.DB}, {Key: "coll", Value: ch.NS.Coll}}},
		{Key: "documentKey", Value: ch.DocumentKey},
		{Key: "clusterTime", Value: ch.ClusterTime}}
	for _, part := range []struct {
		name string
		v    bson.Raw
	}{{"fullDocument", ch.FullDocument}, {"fullDocumentBeforeChange", ch.FullDocumentBeforeChange}, {"updateDescription", ch.UpdateDescription}} {
		if len(part.v) > 0 {
			payload = append(payload, bson.E{Key: part.name, Value: part.v})
		}
	}
	body, err := bson.MarshalExtJSON(payload, false, false)
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: encode a captured change of %s.%s: %w", ch.NS.DB, ch.NS.Coll, err)
	}
	created := ch.WallTime
	if created.IsZero() {
		created = time.Unix(int64(ch.ClusterTime.T), 0)
	}
	return &ferryevent.Event{
		ID:          uuid.NewSHA1(captureNamespace, ch.ID),
		Topic:       c.cfg.Topic(ch.NS.Coll),
		Key:         documentKeyString(ch.DocumentKey),
		Type:        "mongodb." + ch.OperationType,
		ContentType: "application/json",
		Payload:     body,
		CreatedAt:   created.UTC(),
	}, nil
}

// documentKeyString renders a document's _id as an event key: strings as
// they are, ObjectIDs in hex, anything else as relaxed Extended JSON.
func documentKeyString(key bson.Raw) string {
	id, err := key.LookupErr("_id")
	if err != nil {
		return ""
	}
	if s, ok := id.StringValueOK(); ok {
		return s
	}
	if oid, ok := id.ObjectIDOK(); ok {
		return oid.Hex()
	}
	b, err := bson.MarshalExtJSON(bson.D{{Key: "k", Value: id}}, false, false)
	if err != nil {
		return ""
	}
	// {"k":<value>}: keep the value.
	return strings.TrimSuffix(strings.TrimPrefix(string(b), `{"k":`), "}")
}

var _ ferrydriver.Store = (*Capture)(nil)
