package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// Config configures a driver. The zero value is usable.
type Config struct {
	// Prefix names Ferry's collections: <Prefix>outbox, <Prefix>keys, ...
	// Default "ferry_".
	Prefix string
	// Partitions is the number of outbox partitions: the outbox is split
	// by key hash, one relay per partition. The count is stored in
	// <Prefix>meta (Migrate stores this value, or 1) and changed only by
	// SetPartitions; the outbox's validator refuses events computed with
	// another.
	//
	// 0, the default, follows the stored count. Any other value is an
	// assertion: a driver whose count differs from the stored one refuses
	// to append and to open feeds, with an error wrapping
	// ferrydriver.ErrMisconfigured.
	Partitions int
	// OutageAllowance is the longest relay outage the outbox retention
	// must cover beyond the oplog window (checked at start-up). Default 24 h.
	OutageAllowance time.Duration
	// RecoveryMargin is how far before the last acknowledged event a
	// recovery scan starts: at least the longest transaction (MongoDB's
	// transactionLifetimeLimitSeconds, 60 s by default) plus the clock
	// skew between producers. Default 5 min.
	RecoveryMargin time.Duration
	// RetentionTTL, when set, makes MongoDB itself remove outbox events
	// RetentionTTL after they were appended, through a TTL index that
	// Migrate creates (and adjusts or drops when the setting changes). Unlike
	// the relay's retention, a TTL index does not know what the feeds have
	// delivered: it must exceed the oplog window plus OutageAllowance, which
	// CheckRetention verifies. (A capped outbox is not offered: MongoDB does
	// not allow writes to capped collections inside transactions.)
	RetentionTTL time.Duration
	// Logger receives warnings. Default: discard.
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Prefix == "" {
		out.Prefix = "ferry_"
	}
	if out.Partitions < 0 || out.Partitions > ferrydriver.MaxPartitions {
		return out, fmt.Errorf("ferrymongo: Config.Partitions %d is out of range: use 1 to %d, or 0 to follow the count stored in the database", out.Partitions, ferrydriver.MaxPartitions)
	}
	if out.OutageAllowance == 0 {
		out.OutageAllowance = 24 * time.Hour
	}
	if out.RecoveryMargin == 0 {
		out.RecoveryMargin = 5 * time.Minute
	}
	if out.RetentionTTL < 0 || (out.RetentionTTL > 0 && out.RetentionTTL < time.Second) {
		return out, fmt.Errorf("ferrymongo: Config.RetentionTTL %v is too short: a TTL index counts whole seconds; use 0 (no TTL index) or at least the oplog window plus the outage allowance", out.RetentionTTL)
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out, nil
}

// Driver is the MongoDB implementation of ferrydriver.Driver. Its
// transaction type is the context.Context of a session transaction (the
// one mongo.Session.WithTransaction passes to its callback).
type Driver struct {
	cfg    Config
	client *mongo.Client
	db     *mongo.Database
	// collections
	outbox, keys, checkpoints, leases, deadLetters *mongo.Collection
	// stored is the partition count the driver last read; 0 until then.
	stored atomic.Int64
}

// New returns a driver over client's database dbName. It fails at once,
// saying how to fix it, when the server is not a replica set member or
// mongos (change streams and transactions need one). The client stays the
// caller's.
func New(ctx context.Context, client *mongo.Client, dbName string, cfg *Config) (*Driver, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if dbName == "" {
		return nil, errors.New("ferrymongo: New needs a database name")
	}
	if err := checkTopology(ctx, client); err != nil {
		return nil, err
	}
	majority := options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadConcern(readconcern.Majority())
	db := client.Database(dbName)
	d := &Driver{cfg: c, client: client, db: db}
	d.outbox = db.Collection(c.Prefix+"outbox", majority)
	d.keys = db.Collection(c.Prefix+"keys", majority)
	d.checkpoints = db.Collection(c.Prefix+"checkpoints", majority)
	d.leases = db.Collection(c.Prefix+"leases", majority)
	d.deadLetters = db.Collection(c.Prefix+"dead_letters", majority)
	return d, nil
}

// Database is the database the driver's collections live in.
func (d *Driver) Database() *mongo.Database { return d.db }

// hello is the part of the hello reply the topology check reads.
type hello struct {
	SetName string `bson:"setName"`
	Msg     string `bson:"msg"`
}

func checkTopology(ctx context.Context, client *mongo.Client) error {
	var h hello
	if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&h); err != nil {
		return fmt.Errorf("ferrymongo: ask the server what it is (hello): %w", err)
	}
	if h.SetName == "" && h.Msg != "isdbgrid" {
		return errors.New("ferrymongo: " + notReplicaSetHelp)
	}
	return nil
}

// Name implements ferrydriver.Store.
func (d *Driver) Name() string { return "mongodb" }

// Capabilities implements ferrydriver.Store: the feed is a change stream,
// woken by the server; transactions of different keys run concurrently.
func (d *Driver) Capabilities() ferrydriver.Capabilities {
	return ferrydriver.Capabilities{NotifyWakeups: true, ConcurrentWriters: true}
}

// PartitionOf returns the outbox partition Append writes key to
// (ferrydriver.PartitionOf): by Config.Partitions, or, when that is 0, by
// the stored count as the driver last read it (1 before it read one).
func (d *Driver) PartitionOf(key string) int {
	n := d.cfg.Partitions
	if n == 0 {
		n = int(d.stored.Load())
	}
	return ferrydriver.PartitionOf(key, n)
}

// outboxDoc is an event as stored in the outbox collection.
type outboxDoc struct {
	// ID is the event's ID, or for a dead letter that an earlier Ferry
	// redrove by appending it again (its first copy might still have been
	// in the outbox under its ID), a fresh one; EventID then holds the
	// event's. Ferry no longer writes such documents but reads them.
	ID          string            `bson:"_id"`
	EventID     string            `bson:"eid,omitempty"`
	Partition   int               `bson:"p"`
	Topic       string            `bson:"topic"`
	Key         string            `bson:"key"`
	Seq         int64             `bson:"seq"`
	Type        string            `bson:"type"`
	Source      string            `bson:"source,omitempty"`
	ContentType string            `bson:"ct,omitempty"`
	Headers     map[string]string `bson:"headers,omitempty"`
	Payload     []byte            `bson:"payload"`
	Created     createdAt         `bson:",inline"`
	// AppendedAt is when the producer wrote the event (its clock at append
	// time, whatever CreatedAt it was given): recovery scans and retention
	// go by it.
	AppendedAt time.Time `bson:"appended_at"`
	// Partitions is the partition count Partition was computed with, which
	// the outbox's validator checks (see partitions.go).
	Partitions int `bson:"pc,omitempty"`
}

// createdAt is an event's CreatedAt as the outbox and the inbox store it:
// a BSON date, which holds milliseconds, and the nanoseconds: its Unix
// nanoseconds (NS), or, for a time int64 nanoseconds cannot hold (before
// 1678, after 2262), those past its millisecond (SubMS).
type createdAt struct {
	At    time.Time `bson:"created_at"`
	NS    int64     `bson:"created_ns,omitempty"`
	SubMS int64     `bson:"created_sub_ms,omitempty"`
}

func created(t time.Time) createdAt {
	if ns := t.UnixNano(); time.Unix(0, ns).Equal(t) {
		return createdAt{At: t.UTC(), NS: ns}
	}
	return createdAt{At: t.UTC(), SubMS: int64(t.Nanosecond() % int(time.Millisecond))}
}

func (c createdAt) time() time.Time {
	if c.NS != 0 {
		return time.Unix(0, c.NS).UTC()
	}
	return c.At.Add(time.Duration(c.SubMS))
}

func (o *outboxDoc) event() (*ferryevent.Event, error) {
	ev := &ferryevent.Event{Topic: o.Topic, Key: o.Key, Seq: o.Seq, Type: o.Type, Source: o.Source, ContentType: o.ContentType,
		Headers: o.Headers, Payload: o.Payload, CreatedAt: o.Created.time()}
	id := o.ID
	if o.EventID != "" {
		id = o.EventID
	}
	if err := ev.ID.UnmarshalText([]byte(id)); err != nil {
		return ev, fmt.Errorf("event id %q: %w", id, err)
	}
	return ev, nil
}

// AppendTx implements ferrydriver.Driver. tx is the context of the
// caller's session transaction (WithTransaction's callback argument); the
// events commit or abort with it. Each event takes its key's next sequence
// number from the keys collection in the same transaction: producers of one
// key conflict (a TransientTransactionError, which WithTransaction and
// ferry.RunTx run again), producers of different keys do not.
func (d *Driver) AppendTx(ctx context.Context, tx context.Context, events []*ferryevent.Event) error {
	if sess := mongo.SessionFromContext(tx); sess == nil || !sess.TransactionRunning() {
		return errors.New("ferrymongo: AppendTx needs the context of a running session transaction (the argument of Session.WithTransaction's callback)")
	}
	return d.append(ctx, tx, events)
}

// Append implements ferrydriver.Store: the events are written in a
// transaction of their own.
func (d *Driver) Append(ctx context.Context, events []*ferryevent.Event) error {
	return d.inTx(ctx, func(tx context.Context) error { return d.append(ctx, tx, events) })
}

// inTx runs fn in a majority transaction, retried by the driver's
// WithTransaction rules.
func (d *Driver) inTx(ctx context.Context, fn func(tx context.Context) error) error {
	sess, err := d.client.StartSession()
	if err != nil {
		return fmt.Errorf("ferrymongo: start session: %w", err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	_, err = sess.WithTransaction(ctx, func(tx context.Context) (any, error) { return nil, fn(tx) },
		options.Transaction().SetWriteConcern(writeconcern.Majority()).SetReadConcern(readconcern.Snapshot()))
	return err
}

// startTx starts a session transaction (snapshot reads, majority writes)
// for the callers that commit it themselves, without WithTransaction's
// retries; end it with the returned function.
func (d *Driver) startTx(ctx context.Context) (context.Context, *mongo.Session, func(), error) {
	sess, err := d.client.StartSession()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("ferrymongo: start session: %w", err)
	}
	end := func() { sess.EndSession(context.WithoutCancel(ctx)) }
	if err := sess.StartTransaction(options.Transaction().SetWriteConcern(writeconcern.Majority()).SetReadConcern(readconcern.Snapshot())); err != nil {
		end()
		return nil, nil, nil, fmt.Errorf("ferrymongo: start transaction: %w", err)
	}
	return mongo.NewSessionContext(ctx, sess), sess, end, nil
}

// deleteOldest removes the first limit documents of coll that match
// filter in sort order, read first by _id and deleted by _id (DeleteMany
// has no limit); the delete repeats filter, so that a document that
// changed in between stays.
func deleteOldest(ctx context.Context, coll *mongo.Collection, filter, sort bson.D, limit int64) (int64, error) {
	cur, err := coll.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetSort(sort).SetLimit(limit))
	if err != nil {
		return 0, err
	}
	var ids []struct {
		ID bson.RawValue `bson:"_id"`
	}
	if err := cur.All(ctx, &ids); err != nil || len(ids) == 0 {
		return 0, err
	}
	list := make(bson.A, len(ids))
	for i, x := range ids {
		list[i] = x.ID
	}
	res, err := coll.DeleteMany(ctx, append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: list}}}}, filter...))
	if err != nil {
		return 0, err
	}
	return res.DeletedCount, nil
}

// timeRange adds field >= since and < until to filter, for the bounds set.
func timeRange(filter bson.D, field string, since, until time.Time) bson.D {
	at := bson.D{}
	if !since.IsZero() {
		at = append(at, bson.E{Key: "$gte", Value: since})
	}
	if !until.IsZero() {
		at = append(at, bson.E{Key: "$lt", Value: until})
	}
	if len(at) > 0 {
		filter = append(filter, bson.E{Key: field, Value: at})
	}
	return filter
}

// append appends events in the session transaction tx (ctx, outside it,
// reads the stored partition count when the driver has none cached).
func (d *Driver) append(ctx, tx context.Context, events []*ferryevent.Event) error {
	if len(events) == 0 {
		return nil
	}
	count, err := d.writeCount(ctx)
	if err != nil {
		return err
	}
	docs := make([]any, len(events))
	appended := time.Now().UTC()
	for i, ev := range events {
		var k struct {
			Seq int64 `bson:"seq"`
		}
		// touched_at (the server's clock) tells PruneKeys how long the
		// key has been idle; a key it forgot is upserted afresh, Seq 1.
		err := d.keys.FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: ev.Key}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "seq", Value: int64(1)}}}, {Key: "$currentDate", Value: bson.D{{Key: "touched_at", Value: true}}}},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&k)
		if err != nil {
			return fmt.Errorf("ferrymongo: next sequence number of key %s: %w", ev.Key, err)
		}
		ev.Seq = k.Seq
		payload := ev.Payload
		if payload == nil {
			payload = []byte{}
		}
		docs[i] = &outboxDoc{ID: ev.ID.String(), Partition: ferrydriver.PartitionOf(ev.Key, count), Topic: ev.Topic, Key: ev.Key, Seq: k.Seq, Type: ev.Type,
			Source: ev.Source, ContentType: ev.ContentType, Headers: ev.Headers, Payload: payload,
			Created: created(ev.CreatedAt), AppendedAt: appended, Partitions: count}
	}
	if _, err := d.outbox.InsertMany(tx, docs); err != nil {
		if hasCode(err, codeDocumentValidationFailure) {
			return d.refused(ctx, count, err)
		}
		return fmt.Errorf("ferrymongo: append %d event(s): %w", len(docs), err)
	}
	return nil
}

// droppedIndexes are indexes of the inbox that earlier versions created
// and that an index of indexes() replaced: Migrate drops them.
var droppedIndexes = []string{"g_1_state_1_finished_at_1", "g_1_claim_expires_at_1"}

// index is one index Migrate ensures.
type index struct {
	coll  *mongo.Collection
	model mongo.IndexModel
}

func (d *Driver) indexes() []index {
	return []index{
		// Retention and status read a partition by append time; recovery
		// scans it per key in sequence order.
		{d.outbox, mongo.IndexModel{Keys: bson.D{{Key: "p", Value: 1}, {Key: "appended_at", Value: 1}}}},
		{d.outbox, mongo.IndexModel{Keys: bson.D{{Key: "p", Value: 1}, {Key: "key", Value: 1}, {Key: "seq", Value: 1}}}},
		{d.checkpoints, mongo.IndexModel{Keys: bson.D{{Key: "p", Value: 1}}}},
		{d.deadLetters, mongo.IndexModel{Keys: bson.D{{Key: "failed_at", Value: -1}}}},
		// A key's dead letters (the console's key page), newest first.
		{d.deadLetters, mongo.IndexModel{Keys: bson.D{{Key: "event.key", Value: 1}, {Key: "failed_at", Value: -1}, {Key: "event._id", Value: 1}}}},
		// Retention of dead letters: a feed's oldest first.
		{d.deadLetters, mongo.IndexModel{Keys: bson.D{{Key: "feed", Value: 1}, {Key: "failed_at", Value: 1}}}},
		{d.requests(), mongo.IndexModel{Keys: bson.D{{Key: "created_at", Value: 1}}}},
		// A key's head: its unfinished rows in order.
		{d.inbox(), mongo.IndexModel{Keys: bson.D{{Key: "g", Value: 1}, {Key: "key", Value: 1}, {Key: "state", Value: 1}, {Key: "pos", Value: 1}}}},
		// A group's rows of a state in the order they are listed (newest
		// finished, then newest received, first): a page of them, PENDING
		// ones too, is a range of this index, not a sort of all of them.
		// Retention of processed rows reads it too. It replaces one on
		// (g, state, finished_at) (droppedIndexes).
		{d.inbox(), mongo.IndexModel{Keys: bson.D{{Key: "g", Value: 1}, {Key: "state", Value: 1}, {Key: "finished_at", Value: 1},
			{Key: "received_at", Value: 1}, {Key: "_id", Value: 1}}}},
		{d.inboxKeys(), mongo.IndexModel{Keys: bson.D{{Key: "g", Value: 1}, {Key: "runnable_at", Value: 1}}}},
		// A group's keys in key order: a policy change's sweep, a chunk
		// at a time after the last key it reached.
		{d.inboxKeys(), mongo.IndexModel{Keys: bson.D{{Key: "g", Value: 1}, {Key: "k", Value: 1}}}},
		// Keys due for a rescue (an expired claim, suspect rows), and the
		// claimed keys (a claim's rescue is due at its expiry). It
		// replaces one of the rows being processed by claim expiry
		// (droppedIndexes), from before claims moved to the keys.
		{d.inboxKeys(), mongo.IndexModel{Keys: bson.D{{Key: "g", Value: 1}, {Key: "rescue_at", Value: 1}}}},
		// A parked key's head: its first document by pos.
		{d.parked(), mongo.IndexModel{Keys: bson.D{{Key: "feed", Value: 1}, {Key: "key", Value: 1}, {Key: "pos", Value: 1}}}},
		// The keys with redriven events waiting (RedriveDeadLetters),
		// which the feed's relay looks for every heartbeat.
		{d.parked(), mongo.IndexModel{Keys: bson.D{{Key: "feed", Value: 1}, {Key: "key", Value: 1}},
			Options: options.Index().SetPartialFilterExpression(bson.D{{Key: "redriven", Value: true}})}},
		// Activity samples: read by time, and expired by the server.
		{d.activity(), mongo.IndexModel{Keys: bson.D{{Key: "at", Value: 1}},
			Options: options.Index().SetExpireAfterSeconds(int32(ferrydriver.DefaultActivityRetention / time.Second))}},
	}
}

// Migrations implements ferrydriver.Store: MongoDB has no schema, only
// collections and indexes, which Migrate creates.
func (d *Driver) Migrations() []ferrydriver.Migration {
	return []ferrydriver.Migration{{Version: 1, Name: "outbox",
		Up:   "create the collections " + d.cfg.Prefix + "{outbox,keys,checkpoints,leases,dead_letters,requests,inbox,inbox_keys,inbox_groups,counters,meta,parked} and their indexes",
		Down: "drop them"}, {Version: 2, Name: "partitions",
		Up: "store the partition count in " + d.cfg.Prefix + "meta (Config.Partitions, or what an existing outbox uses, or 1) " +
			"and set the outbox's validator to refuse events computed with another count",
		Down: "dropped with the collections"}, {Version: 3, Name: "activity",
		Up:   "create the collection " + d.cfg.Prefix + "activity (what relays and consumers did, for the console), its samples expiring after a day",
		Down: "dropped with the collections"}, {Version: 4, Name: "redriven",
		Up:   "index the redriven dead letters waiting in " + d.cfg.Prefix + "parked by feed and key (a relay looks for them every heartbeat)",
		Down: "dropped with the collections"}, {Version: 5, Name: "inbox_sweep",
		Up: "index " + d.cfg.Prefix + "inbox_keys by group and key (a dead-policy change sweeps a group's keys in key order, " +
			"its progress stored with the policy in " + d.cfg.Prefix + "inbox_groups, so that an interrupted change resumes)",
		Down: "dropped with the collections"}, {Version: 6, Name: "claims_by_key",
		Up: "index " + d.cfg.Prefix + "inbox_keys by group and rescue time, drop the index of " + d.cfg.Prefix + "inbox by claim expiry, " +
			"and make the rows claimed under version 5 (PROCESSING) PENDING again, their keys due: claims live on the keys now",
		Down: "dropped with the collections"}}
}

// Migrate implements ferrydriver.Store: it creates the collections (a
// transaction cannot create one on servers before 4.4) and indexes.
func (d *Driver) Migrate(ctx context.Context, p *ferrydriver.MigrateParams) (*ferrydriver.MigrateResult, error) {
	ms := d.Migrations()
	if p.DryRun {
		return &ferrydriver.MigrateResult{Applied: ms, Current: len(ms)}, nil
	}
	colls := []*mongo.Collection{d.outbox, d.keys, d.checkpoints, d.leases, d.deadLetters, d.requests(),
		d.inbox(), d.inboxKeys(), d.inboxGroups(), d.counters(), d.meta(), d.parked(), d.activity()}
	if p.Down {
		for _, c := range colls {
			if err := c.Drop(ctx); err != nil {
				return nil, fmt.Errorf("ferrymongo: drop %s: %w", c.Name(), err)
			}
		}
		return &ferrydriver.MigrateResult{Applied: ms, Current: 0}, nil
	}
	existing, err := d.db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: list collections: %w", err)
	}
	have := map[string]bool{}
	for _, n := range existing {
		have[n] = true
	}
	for _, c := range colls {
		if have[c.Name()] {
			continue
		}
		if err := d.db.CreateCollection(ctx, c.Name()); err != nil && !hasCode(err, 48) { // 48: NamespaceExists
			return nil, fmt.Errorf("ferrymongo: create %s: %w", c.Name(), err)
		}
	}
	for _, ix := range d.indexes() {
		if _, err := ix.coll.Indexes().CreateOne(ctx, ix.model); err != nil {
			return nil, fmt.Errorf("ferrymongo: index on %s: %w", ix.coll.Name(), err)
		}
	}
	for _, name := range droppedIndexes {
		if err := d.inbox().Indexes().DropOne(ctx, name); err != nil && !hasCode(err, 27) { // 27: IndexNotFound
			return nil, fmt.Errorf("ferrymongo: drop the replaced index %s of %s: %w", name, d.inbox().Name(), err)
		}
	}
	if err := d.migrateClaims(ctx); err != nil {
		return nil, err
	}
	if err := d.reconcileTTL(ctx); err != nil {
		return nil, err
	}
	// A feed with no saved position reads "from the beginning": from the
	// cluster time at which the outbox was created, kept here.
	t, err := d.clusterTime(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := d.meta().UpdateOne(ctx, bson.D{{Key: "_id", Value: "outbox"}},
		bson.D{{Key: "$setOnInsert", Value: bson.D{{Key: "created", Value: t}}}}, options.UpdateOne().SetUpsert(true)); err != nil {
		return nil, fmt.Errorf("ferrymongo: record the outbox's creation time: %w", err)
	}
	if err := d.migratePartitions(ctx); err != nil {
		return nil, err
	}
	return &ferrydriver.MigrateResult{Applied: ms, Current: len(ms)}, nil
}

// migrateClaims makes the rows a consumer of version 5 left claimed
// (stored PROCESSING, their claims on the rows) PENDING again, and their
// keys due now: they run again, their counted attempt kept.
func (d *Driver) migrateClaims(ctx context.Context) error {
	res, err := d.inbox().UpdateMany(ctx, bson.D{{Key: "state", Value: string(ferrydriver.InboxProcessing)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: string(ferrydriver.InboxPending)}, {Key: "reclaimed", Value: true}}},
			{Key: "$unset", Value: bson.D{{Key: "claimed_by", Value: ""}, {Key: "claim_token", Value: ""}, {Key: "claim_expires_at", Value: ""}}}})
	if err != nil {
		return fmt.Errorf("ferrymongo: release the rows claimed under version 5: %w", err)
	}
	if res.ModifiedCount == 0 {
		return nil
	}
	cur, err := d.inbox().Aggregate(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "reclaimed", Value: true}}}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "g", Value: "$g"}, {Key: "k", Value: "$key"}}}}}}})
	if err != nil {
		return fmt.Errorf("ferrymongo: release the rows claimed under version 5: %w", err)
	}
	var keys []struct {
		ID struct {
			G string `bson:"g"`
			K string `bson:"k"`
		} `bson:"_id"`
	}
	if err := cur.All(ctx, &keys); err != nil {
		return fmt.Errorf("ferrymongo: release the rows claimed under version 5: %w", err)
	}
	now := time.Now().UTC()
	for _, k := range keys {
		if _, err := d.inboxKeys().UpdateOne(ctx, bson.D{{Key: "_id", Value: keyID(k.ID.G, k.ID.K)}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "g", Value: k.ID.G}, {Key: "k", Value: k.ID.K}, {Key: "runnable_at", Value: now}, {Key: "held_by", Value: nil}}}, bump},
			options.UpdateOne().SetUpsert(true)); err != nil {
			return fmt.Errorf("ferrymongo: make the key %s of group %s due: %w", k.ID.K, k.ID.G, err)
		}
	}
	if _, err := d.inbox().UpdateMany(ctx, bson.D{{Key: "reclaimed", Value: true}}, bson.D{{Key: "$unset", Value: bson.D{{Key: "reclaimed", Value: ""}}}}); err != nil {
		return fmt.Errorf("ferrymongo: release the rows claimed under version 5: %w", err)
	}
	return nil
}

// ttlIndexName names the outbox's TTL index (Config.RetentionTTL).
const ttlIndexName = "ferry_retention_ttl"

// ttlSeconds is Config.RetentionTTL as a TTL index counts it.
func ttlSeconds(ttl time.Duration) int32 { return int32(min(ttl/time.Second, math.MaxInt32)) }

// reconcileTTL makes the outbox's TTL index match Config.RetentionTTL:
// created when missing, its expiry changed in place (collMod) when it
// differs, dropped when the setting is off.
func (d *Driver) reconcileTTL(ctx context.Context) error {
	cur, err := d.outbox.Indexes().List(ctx)
	if err != nil {
		return fmt.Errorf("ferrymongo: list the outbox's indexes: %w", err)
	}
	var specs []struct {
		Name   string `bson:"name"`
		Expire *int64 `bson:"expireAfterSeconds"`
	}
	if err := cur.All(ctx, &specs); err != nil {
		return fmt.Errorf("ferrymongo: list the outbox's indexes: %w", err)
	}
	wantSecs := int64(ttlSeconds(d.cfg.RetentionTTL))
	for _, s := range specs {
		if s.Name != ttlIndexName {
			continue
		}
		switch {
		case d.cfg.RetentionTTL == 0:
			d.cfg.Logger.Warn("ferrymongo: RetentionTTL is off; dropping the outbox's TTL index", "index", ttlIndexName)
			if err := d.outbox.Indexes().DropOne(ctx, ttlIndexName); err != nil {
				return fmt.Errorf("ferrymongo: drop the outbox's TTL index: %w", err)
			}
		case s.Expire == nil || *s.Expire != wantSecs:
			err := d.db.RunCommand(ctx, bson.D{{Key: "collMod", Value: d.outbox.Name()}, {Key: "index", Value: bson.D{
				{Key: "name", Value: ttlIndexName}, {Key: "expireAfterSeconds", Value: wantSecs}}}}).Err()
			if err != nil {
				return fmt.Errorf("ferrymongo: change the outbox's TTL to %v (collMod): %w", d.cfg.RetentionTTL, err)
			}
		}
		return nil
	}
	if d.cfg.RetentionTTL == 0 {
		return nil
	}
	want := mongo.IndexModel{Keys: bson.D{{Key: "appended_at", Value: 1}},
		Options: options.Index().SetName(ttlIndexName).SetExpireAfterSeconds(ttlSeconds(d.cfg.RetentionTTL))}
	if _, err := d.outbox.Indexes().CreateOne(ctx, want); err != nil {
		return fmt.Errorf("ferrymongo: create the outbox's TTL index: %w", err)
	}
	return nil
}

var _ ferrydriver.Driver[context.Context] = (*Driver)(nil)
