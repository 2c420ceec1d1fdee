package ferrymongo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// cursor is a feed position.
//
// In stream mode it is the change stream's resume token after the last
// event read (or its postBatchResumeToken on a quiet stream) and At, the
// latest creation time among the events read. In recovery mode (after the
// oplog lost the position) the feed scans the outbox itself, per key in
// sequence order, from From, and then opens a new stream at StartAt, the
// cluster time taken before the scan began.
type cursor struct {
	Token []byte    `json:"token,omitempty"`
	At    time.Time `json:"at,omitzero"`

	Recover  bool      `json:"recover,omitempty"`
	From     time.Time `json:"from,omitzero"`
	AfterKey string    `json:"after_key,omitempty"`
	AfterSeq int64     `json:"after_seq,omitempty"`
	StartT   uint32    `json:"start_t,omitempty"`
	StartI   uint32    `json:"start_i,omitempty"`
}

func (c cursor) recovering() bool { return c.Recover }

func decodeCursor(b []byte) (cursor, error) {
	var c cursor
	if len(b) == 0 {
		return c, nil
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("ferrymongo: the saved feed position %q is not a MongoDB feed cursor (was it saved by another backend?): %w", b, err)
	}
	return c, nil
}

func (c cursor) encode() []byte {
	b, _ := json.Marshal(c)
	return b
}

type feed struct {
	d         *Driver
	name      string
	partition int
	pos       cursor
	cs        *mongo.ChangeStream
}

// OpenFeed implements ferrydriver.Store. The stream opens lazily, on the
// first Read, so that its errors go through the same decisions as later
// ones.
func (d *Driver) OpenFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) (ferrydriver.Feed, error) {
	if err := d.checkFeed(ctx, p); err != nil {
		return nil, err
	}
	pos, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, err
	}
	return &feed{d: d, name: p.Feed, partition: p.Partition, pos: pos}, nil
}

// Close implements ferrydriver.Feed.
func (f *feed) Close() error {
	if f.cs == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := f.cs.Close(ctx)
	f.cs = nil
	return err
}

// Read implements ferrydriver.Feed.
func (f *feed) Read(ctx context.Context, p *ferrydriver.ReadParams) (*ferrydriver.Batch, error) {
	if f.pos.Recover {
		return f.readRecovery(ctx, max(p.Max, 1))
	}
	if f.cs == nil {
		if err := f.open(ctx); err != nil {
			return f.failed(ctx, err)
		}
	}
	b := &ferrydriver.Batch{}
	token, invalidated, err := readStream(ctx, f.cs, f.pos.Token, max(p.Max, 1), p.Wait,
		func() int { return len(b.Events) + len(b.Invalid) },
		func(raw bson.Raw) error {
			var change struct {
				FullDocument outboxDoc `bson:"fullDocument"`
			}
			if err := bson.Unmarshal(raw, &change); err != nil {
				return fmt.Errorf("ferrymongo: decode a change of %s: %w", f.d.outbox.Name(), err)
			}
			f.collect(b, &change.FullDocument)
			return nil
		})
	if err != nil {
		if errors.Is(err, errDecode) {
			return nil, err
		}
		return f.failed(ctx, err)
	}
	f.pos.Token = token
	if invalidated {
		// The outbox was dropped or renamed: continue after it
		// (startAfter), on the collection created in its place.
		f.d.cfg.Logger.Error("ferrymongo: the outbox collection was dropped or renamed; the feed continues on the new one",
			"feed", f.name, "collection", f.d.outbox.Name())
		_ = f.Close()
	}
	b.Cursor = f.pos.encode()
	return b, nil
}

// errDecode marks a change that could not be decoded: not a stream error.
var errDecode = errors.New("undecodable change")

// readStream reads changes from cs into handle until n() reaches max, the
// wait passes with nothing read, or an invalidate event ends the stream.
// It returns the position to save after what was read (see nextToken).
// A stream error with changes already read is held back: those are
// delivered first and the error comes again on the next read.
func readStream(ctx context.Context, cs *mongo.ChangeStream, prev []byte, limit int, wait time.Duration,
	n func() int, handle func(bson.Raw) error) (token []byte, invalidated bool, err error) {
	var lastID []byte
	deadline := time.Now().Add(wait)
	for n() < limit {
		if cs.TryNext(ctx) {
			lastID = append([]byte(nil), cs.Current.Lookup("_id").Value...)
			if op, _ := cs.Current.Lookup("operationType").StringValueOK(); op == "invalidate" {
				// Continue after it (startAfter); the caller closes the stream.
				return lastID, true, nil
			}
			if err := handle(cs.Current); err != nil {
				return nil, false, fmt.Errorf("%w: %w", errDecode, err)
			}
			continue
		}
		if err := cs.Err(); err != nil {
			if n() > 0 {
				break
			}
			return nil, false, err
		}
		if n() > 0 || !time.Now().Before(deadline) {
			break
		}
	}
	return nextToken(prev, cs.ResumeToken(), lastID, n(), cs.RemainingBatchLength()), false, nil
}

func (f *feed) collect(b *ferrydriver.Batch, doc *outboxDoc) {
	if doc.AppendedAt.After(f.pos.At) {
		f.pos.At = doc.AppendedAt
	}
	ev, err := doc.event()
	if err == nil {
		err = ferryevent.CheckRelayable(ev)
	}
	if err != nil {
		b.Invalid = append(b.Invalid, &ferrydriver.InvalidRecord{Event: *ev, Reason: "invalid outbox document: " + err.Error()})
		return
	}
	b.Events = append(b.Events, ev)
}

// open starts the change stream after the saved token, or at the saved
// start time of a finished recovery, or now.
func (f *feed) open(ctx context.Context) error {
	pipeline := mongo.Pipeline{{{Key: "$match", Value: bson.D{
		{Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert", "invalidate"}}}},
		{Key: "$or", Value: bson.A{bson.D{{Key: "operationType", Value: "invalidate"}}, bson.D{{Key: "fullDocument.p", Value: f.partition}}}},
	}}}} // never $project: the driver needs each change's _id to resume
	opts := options.ChangeStream().SetMaxAwaitTime(200 * time.Millisecond)
	switch {
	case len(f.pos.Token) > 0:
		opts.SetStartAfter(bson.Raw(f.pos.Token)) // startAfter also crosses an invalidate
	case f.pos.StartT != 0:
		opts.SetStartAtOperationTime(&bson.Timestamp{T: f.pos.StartT, I: f.pos.StartI})
	default:
		// No position yet: from the beginning, the outbox's creation time
		// (if the oplog no longer reaches it, the stream reports history
		// lost and the feed scans the outbox instead).
		var meta struct {
			Created bson.Timestamp `bson:"created"`
		}
		err := f.d.meta().FindOne(ctx, bson.D{{Key: "_id", Value: "outbox"}}).Decode(&meta)
		switch {
		case err == nil && meta.Created.T != 0:
			opts.SetStartAtOperationTime(&meta.Created)
		case err != nil && !errors.Is(err, mongo.ErrNoDocuments):
			return fmt.Errorf("ferrymongo: read the outbox's creation time: %w", err)
		}
	}
	cs, err := f.d.outbox.Watch(ctx, pipeline, opts)
	if err != nil {
		return err
	}
	f.cs = cs
	return nil
}

// failed applies the stream decisions to err: a reopen comes with the
// next Read (the relay backs off); a recovery switches the feed to a scan
// of the outbox and returns an empty batch whose cursor says so, so that
// the relay saves it (a relay that restarts then goes on scanning instead
// of meeting the lost position again); anything else is returned as is.
func (f *feed) failed(ctx context.Context, err error) (*ferrydriver.Batch, error) {
	_ = f.Close()
	action, why := decideStreamError(err)
	switch action {
	case streamReopen:
		return nil, fmt.Errorf("ferrymongo: change stream of %s interrupted (%s); it reopens from the last position: %w", f.name, why, err)
	case streamRecover:
		if rerr := f.startRecovery(ctx); rerr != nil {
			return nil, rerr
		}
		f.d.cfg.Logger.Warn("ferrymongo: the change stream lost its position; publishing from the outbox collection instead",
			"feed", f.name, "reason", why, "err", err, "from", f.pos.From)
		return &ferrydriver.Batch{Cursor: f.pos.encode()}, nil
	}
	return nil, fmt.Errorf("ferrymongo: change stream of %s: %s: %w", f.name, why, err)
}

// startRecovery switches to a scan of the outbox from the last
// acknowledged event's time minus the recovery margin. It fails, saying
// what to do, when retention may already have removed events the feed has
// not delivered.
func (f *feed) startRecovery(ctx context.Context) error {
	from := time.Time{}
	if !f.pos.At.IsZero() {
		from = f.pos.At.Add(-f.d.cfg.RecoveryMargin)
	}
	t, err := f.d.clusterTime(ctx)
	if err != nil {
		return err
	}
	f.pos = cursor{Recover: true, From: from, At: f.pos.At, StartT: t.T, StartI: t.I}
	return nil
}

// clusterTime reads the server's current cluster time.
func (d *Driver) clusterTime(ctx context.Context) (bson.Timestamp, error) {
	var reply struct {
		OperationTime bson.Timestamp `bson:"operationTime"`
	}
	if err := d.db.RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Decode(&reply); err != nil {
		return bson.Timestamp{}, fmt.Errorf("ferrymongo: read the cluster time: %w", err)
	}
	if reply.OperationTime.T == 0 {
		return bson.Timestamp{}, errors.New("ferrymongo: the server reported no cluster time: " + notReplicaSetHelp)
	}
	return reply.OperationTime, nil
}

// readRecovery reads the next events of the recovery scan: the partition's
// events created since From, per key in sequence order (keys in any order
// relative to each other). When the scan is done the feed opens a stream
// at the cluster time taken before it began; events committed meanwhile
// come twice, which the at-least-once contract allows.
func (f *feed) readRecovery(ctx context.Context, limit int) (*ferrydriver.Batch, error) {
	filter := bson.D{{Key: "p", Value: f.partition}}
	if !f.pos.From.IsZero() {
		filter = append(filter, bson.E{Key: "appended_at", Value: bson.D{{Key: "$gte", Value: f.pos.From}}})
	}
	if f.pos.AfterKey != "" {
		filter = append(filter, bson.E{Key: "$or", Value: bson.A{
			bson.D{{Key: "key", Value: bson.D{{Key: "$gt", Value: f.pos.AfterKey}}}},
			bson.D{{Key: "key", Value: f.pos.AfterKey}, {Key: "seq", Value: bson.D{{Key: "$gt", Value: f.pos.AfterSeq}}}},
		}})
	}
	// Read at or after the cluster time taken before the scan (a causally
	// consistent session): a transaction that committed before it is seen
	// here, one that committed after it comes through the new stream.
	sess, err := f.d.client.StartSession(options.Session().SetCausalConsistency(true))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: recovery scan of %s: %w", f.name, err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	if err := sess.AdvanceOperationTime(&bson.Timestamp{T: f.pos.StartT, I: f.pos.StartI}); err != nil {
		return nil, fmt.Errorf("ferrymongo: recovery scan of %s: %w", f.name, err)
	}
	sctx := mongo.NewSessionContext(ctx, sess)
	cur, err := f.d.outbox.Find(sctx, filter, options.Find().SetSort(bson.D{{Key: "key", Value: 1}, {Key: "seq", Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: recovery scan of %s: %w", f.name, err)
	}
	var docs []outboxDoc
	if err := cur.All(sctx, &docs); err != nil {
		return nil, fmt.Errorf("ferrymongo: recovery scan of %s: %w", f.name, err)
	}
	b := &ferrydriver.Batch{}
	for i := range docs {
		f.collect(b, &docs[i])
		f.pos.AfterKey, f.pos.AfterSeq = docs[i].Key, docs[i].Seq
	}
	if len(docs) < limit {
		// Scan done: back to the stream, from before the scan.
		f.pos = cursor{At: f.pos.At, StartT: f.pos.StartT, StartI: f.pos.StartI}
	}
	b.Cursor = f.pos.encode()
	return b, nil
}
