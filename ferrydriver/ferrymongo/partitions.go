package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The partition count is stored in <Prefix>meta as {_id: "partitions", n}
// and enforced by the outbox collection's validator, which accepts an
// event only if its pc field (the count its producer computed its
// partition with) is the stored count. The guard thus costs producers no
// round trip: a driver reads the count once and caches it, and when it is
// stale the insert itself fails (DocumentValidationFailure), which aborts
// the caller's transaction before it can commit an event into the wrong
// partition. A driver that follows the stored count then reads it again and
// reports a TransientTransactionError, so that WithTransaction and RunTx
// run the transaction again with the new count.
//
// Changing the validator (collMod) takes the collection's exclusive lock,
// so it waits for the transactions that wrote the outbox and makes later
// ones retry; a transaction whose snapshot predates it fails on the
// outbox with a transient error. Documents without pc (written by Ferry
// before the count was stored) pass, as such producers are unguarded
// anywhere. Not yet run against a real server: see "How it is verified".

const (
	partitionsID = "partitions"
	// codeDocumentValidationFailure: the outbox's validator refused an insert.
	codeDocumentValidationFailure = 121
)

// partitionValidator is the outbox's validator for a stored count n, or,
// for n == 0, the one SetPartitions holds while it checks: it refuses
// every guarded event.
func partitionValidator(n int) bson.D {
	unguarded := bson.D{{Key: "pc", Value: bson.D{{Key: "$exists", Value: false}}}}
	if n == 0 {
		return unguarded
	}
	return bson.D{{Key: "$or", Value: bson.A{unguarded, bson.D{{Key: "pc", Value: n}}}}}
}

// refusalAction is what an append the outbox's validator refused means.
type refusalAction int

const (
	// refusalRetry: the count changed (the driver follows it and has the
	// new one now) or a change is under way: run the transaction again.
	refusalRetry refusalAction = iota
	// refusalMisconfigured: the driver asserts a count the schema does not
	// store: no retry can help.
	refusalMisconfigured
)

// decideRefusal decides on an append refused by the validator, from the
// driver's Config.Partitions (0: follows) and the count stored now.
func decideRefusal(configured, stored int) refusalAction {
	if configured > 0 && configured != stored {
		return refusalMisconfigured
	}
	return refusalRetry
}

// partitionsChangedError is the transient error of an append refused
// because the stored count changed after the driver read it, or is being
// changed: nothing was written, and the transaction runs again.
type partitionsChangedError struct {
	used, stored int
	err          error
}

func (e *partitionsChangedError) Error() string {
	if e.stored < 0 {
		return fmt.Sprintf("ferrymongo: append events to the outbox: the outbox's validator refused partition count %d, and the stored count could not be read; "+
			"nothing was written: run the transaction again (%v)", e.used, e.err)
	}
	if e.stored == e.used {
		return fmt.Sprintf("ferrymongo: append events to the outbox: the outbox's validator refused partition count %d, which is the stored one: "+
			"a change of the count is under way (run the transaction again), or one was interrupted (`ferry migrate up` restores the validator): %v", e.used, e.err)
	}
	return fmt.Sprintf("ferrymongo: append events to the outbox: the stored partition count changed from %d to %d; nothing was written: run the transaction again (%v)",
		e.used, e.stored, e.err)
}

func (e *partitionsChangedError) Unwrap() error { return e.err }

// HasErrorLabel makes the error a TransientTransactionError for
// WithTransaction and RunTx (mongo.LabeledError).
func (e *partitionsChangedError) HasErrorLabel(label string) bool { return label == labelTransient }

// StoredPartitions implements ferrydriver.Store: the count in
// <Prefix>meta, written by Migrate.
func (d *Driver) StoredPartitions(ctx context.Context) (int, error) {
	var doc struct {
		N int `bson:"n"`
	}
	err := d.meta().FindOne(ctx, bson.D{{Key: "_id", Value: partitionsID}}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && doc.N < 1) {
		return 0, fmt.Errorf("ferrymongo: read the partition count: %w: %smeta has no partition count; run `ferry migrate up` or Driver.Migrate",
			ferrydriver.ErrSchemaMissing, d.cfg.Prefix)
	}
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: read the partition count: %w", err)
	}
	d.stored.Store(int64(doc.N))
	return doc.N, nil
}

// writeCount is the count an append computes partitions with: the cached
// stored count (read once), which a driver with Config.Partitions set must
// match.
func (d *Driver) writeCount(ctx context.Context) (int, error) {
	n := int(d.stored.Load())
	if n == 0 {
		var err error
		if n, err = d.StoredPartitions(ctx); err != nil {
			return 0, err
		}
	}
	if d.cfg.Partitions > 0 {
		if d.cfg.Partitions != n {
			return 0, d.mismatch("append events to the outbox", n)
		}
		return d.cfg.Partitions, nil
	}
	return n, nil
}

// refused turns an insert the validator refused into the error to return.
// It forgets the cached count first: if it cannot read the stored one now,
// the transaction's next run does.
func (d *Driver) refused(ctx context.Context, used int, err error) error {
	d.stored.Store(0)
	stored, rerr := d.StoredPartitions(context.WithoutCancel(ctx))
	if rerr != nil {
		return &partitionsChangedError{used: used, stored: -1, err: errors.Join(err, rerr)}
	}
	if decideRefusal(d.cfg.Partitions, stored) == refusalMisconfigured {
		return d.mismatch("append events to the outbox", stored)
	}
	return &partitionsChangedError{used: used, stored: stored, err: err}
}

func (d *Driver) mismatch(op string, stored int) error {
	return d.countStore().Mismatch(op, d.cfg.Partitions, stored)
}

// countStore names the database in partition-count errors.
func (d *Driver) countStore() driverkit.CountStore {
	return driverkit.CountStore{Driver: "ferrymongo", Kind: "database", Name: d.db.Name()}
}

// checkFeed refuses a feed of a driver configured with another count than
// the stored one, or of a partition outside the stored range.
func (d *Driver) checkFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) error {
	stored, err := d.StoredPartitions(ctx)
	if err != nil {
		return err
	}
	return d.countStore().CheckFeed("open feed "+p.Feed, d.cfg.Partitions, stored, p.Partition)
}

// setValidator makes the outbox's validator accept the count n (0: none).
func (d *Driver) setValidator(ctx context.Context, n int) error {
	err := d.db.RunCommand(ctx, bson.D{{Key: "collMod", Value: d.outbox.Name()},
		{Key: "validator", Value: partitionValidator(n)}, {Key: "validationLevel", Value: "strict"}, {Key: "validationAction", Value: "error"}}).Err()
	if err != nil {
		return fmt.Errorf("ferrymongo: set the outbox's validator to partition count %d (collMod): %w", n, err)
	}
	return nil
}

// highestPartition is the highest partition of coll's documents (field p),
// or -1.
func highestPartition(ctx context.Context, coll *mongo.Collection) (int, error) {
	var doc struct {
		P int `bson:"p"`
	}
	err := coll.FindOne(ctx, bson.D{{Key: "p", Value: bson.D{{Key: "$exists", Value: true}}}},
		options.FindOne().SetSort(bson.D{{Key: "p", Value: -1}}).SetProjection(bson.D{{Key: "p", Value: 1}})).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: read the highest partition of %s: %w", coll.Name(), err)
	}
	return doc.P, nil
}

// migratePartitions stores the partition count if none is stored (the
// migrating driver's, or the one an existing outbox uses, or 1) and holds
// the outbox's validator to the stored count.
func (d *Driver) migratePartitions(ctx context.Context) error {
	n := d.cfg.Partitions
	if n == 0 {
		n = 1
		for _, c := range []*mongo.Collection{d.checkpoints, d.outbox} {
			h, err := highestPartition(ctx, c)
			if err != nil {
				return err
			}
			n = max(n, h+1)
		}
	}
	if _, err := d.meta().UpdateOne(ctx, bson.D{{Key: "_id", Value: partitionsID}},
		bson.D{{Key: "$setOnInsert", Value: bson.D{{Key: "n", Value: n}}}}, options.UpdateOne().SetUpsert(true)); err != nil {
		return fmt.Errorf("ferrymongo: store the partition count: %w", err)
	}
	stored, err := d.StoredPartitions(ctx)
	if err != nil {
		return err
	}
	return d.setValidator(ctx, stored)
}

// SetPartitions implements ferrydriver.Store. It first sets the
// outbox's validator to refuse every guarded event, so that no producer
// writes while it checks; then, unless p.Force, it refuses with
// ferrydriver.ErrPartitionChangeUnsafe (and restores the validator) while a
// relay holds a lease on a feed ("<feed>/<partition>"), while a feed has
// events after its checkpoint (its change stream, opened after the saved
// position, has any) or is recovering, or while a partition has events and
// no feed has a checkpoint for it. Otherwise it stores the new count and
// sets the validator to it. Drivers that follow the count read it again
// when their next insert is refused; other drivers are refused from then
// on. If it stops half-way the validator refuses every event: `ferry
// migrate up` (Migrate) sets it to the stored count again.
func (d *Driver) SetPartitions(ctx context.Context, p *ferrydriver.SetPartitionsParams) (int, error) {
	if p.Partitions < 1 || p.Partitions > ferrydriver.MaxPartitions {
		return 0, fmt.Errorf("ferrymongo: set the partition count to %d: out of range: use 1 to %d", p.Partitions, ferrydriver.MaxPartitions)
	}
	op := fmt.Sprintf("set the partition count of database %s to %d", d.db.Name(), p.Partitions)
	prev, err := d.StoredPartitions(ctx)
	if err != nil && !(p.Force && errors.Is(err, ferrydriver.ErrSchemaMissing)) {
		return 0, err
	}
	res := prev
	if err := d.setValidator(ctx, 0); err != nil {
		return 0, fmt.Errorf("ferrymongo: %s: hold producers back: %w", op, err)
	}
	restore := func() error {
		if prev == 0 {
			return nil
		}
		return d.setValidator(context.WithoutCancel(ctx), prev)
	}
	if !p.Force {
		problems, err := d.changeProblems(ctx, prev)
		if err != nil {
			return 0, errors.Join(fmt.Errorf("ferrymongo: %s: %w", op, err), restore())
		}
		if len(problems) > 0 {
			return 0, errors.Join(driverkit.PartitionChangeRefused("ferrymongo", op, problems), restore())
		}
	}
	if _, err := d.meta().UpdateOne(ctx, bson.D{{Key: "_id", Value: partitionsID}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: p.Partitions}}}}, options.UpdateOne().SetUpsert(true)); err != nil {
		return 0, errors.Join(fmt.Errorf("ferrymongo: %s: %w", op, err), restore())
	}
	if err := d.setValidator(ctx, p.Partitions); err != nil {
		return 0, fmt.Errorf("ferrymongo: %s: the count is stored but the outbox refuses every event until its validator is set: run `ferry migrate up`: %w", op, err)
	}
	d.stored.Store(int64(p.Partitions))
	return res, nil
}

// drainWait is how long SetPartitions reads a feed's change stream after
// its checkpoint to see whether anything is left.
const drainWait = time.Second

// changeProblems says why changing the count now is unsafe, if it is.
func (d *Driver) changeProblems(ctx context.Context, stored int) ([]string, error) {
	var problems []string
	cur, err := d.leases.Find(ctx, bson.D{{Key: "$expr", Value: expr("$gt", "$expires_at", "$$NOW")}})
	if err != nil {
		return nil, fmt.Errorf("read the leases: %w", err)
	}
	var leases []struct {
		Name   string    `bson:"_id"`
		Holder string    `bson:"holder"`
		Until  time.Time `bson:"expires_at"`
	}
	if err := cur.All(ctx, &leases); err != nil {
		return nil, fmt.Errorf("read the leases: %w", err)
	}
	for _, l := range leases {
		if driverkit.IsRelayLease(l.Name) {
			problems = append(problems, driverkit.LeaseHeldProblem(l.Holder, l.Name, "until "+l.Until.UTC().Format(time.RFC3339)))
		}
	}

	cur, err = d.checkpoints.Find(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("read the checkpoints: %w", err)
	}
	var cps []struct {
		Feed          string `bson:"_id"`
		checkpointDoc `bson:",inline"`
	}
	if err := cur.All(ctx, &cps); err != nil {
		return nil, fmt.Errorf("read the checkpoints: %w", err)
	}
	read := map[int]bool{}
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		errs   []error
		behind = map[string]string{}
	)
	for _, c := range cps {
		n, ok := driverkit.FeedPartition(c.Feed)
		if !ok || n != c.Partition {
			continue
		}
		read[n] = true
		wg.Go(func() {
			why, err := d.undelivered(ctx, c.Feed, c.Partition, c.Cursor)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if why != "" {
				behind[c.Feed] = why
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, c := range cps {
		if why, ok := behind[c.Feed]; ok {
			problems = append(problems, fmt.Sprintf("feed %s %s", c.Feed, why))
		}
	}
	highest, err := highestPartition(ctx, d.outbox)
	if err != nil {
		return nil, err
	}
	for part := range max(stored, highest+1) {
		if read[part] {
			continue
		}
		n, err := d.outbox.CountDocuments(ctx, bson.D{{Key: "p", Value: part}}, options.Count().SetLimit(1))
		if err != nil {
			return nil, fmt.Errorf("look for events of partition %d: %w", part, err)
		}
		if n > 0 {
			problems = append(problems, driverkit.UnreadPartitionProblem(part))
		}
	}
	return problems, nil
}

// undelivered reads a feed's change stream after its checkpoint, as its
// relay would, and says what is left ("" when nothing is).
func (d *Driver) undelivered(ctx context.Context, name string, partition int, saved []byte) (string, error) {
	pos, err := decodeCursor(saved)
	if err != nil {
		return "", err
	}
	if pos.Recover {
		return "is recovering from lost oplog history", nil
	}
	f := &feed{d: d, name: name, partition: partition, pos: pos}
	defer f.Close()
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 1, Wait: drainWait})
	if err != nil {
		return "", fmt.Errorf("read feed %s after its checkpoint: %w", name, err)
	}
	if len(b.Events)+len(b.Invalid) > 0 || f.pos.Recover {
		return fmt.Sprintf("has not delivered every event of partition %d", partition), nil
	}
	return "", nil
}
