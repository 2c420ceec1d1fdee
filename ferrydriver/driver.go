// Package ferrydriver is the seam between Ferry and a database, in three
// parts: Store, what producers and relays need (the outbox, its feed,
// checkpoints, leases, dead letters, parked keys, partitions); Inbox, what
// consumers need (a group's rows, claims, finishes, retractions,
// settlement); Admin, what operators need of either (reasons, attempt
// histories, groups, activity), which both include. Driver is a Store that
// also appends inside a caller's transaction. ferry.RunTx's seam is in
// package txdriver. Each backend (ferrypg, ferrysqlite, ferrymysql,
// ferrymongo) implements them all and passes the behavioural suite in
// ferrydrivertest; the inbox's per-key rules are written once, in package
// inboxmodel, and the suite holds every backend to them.
//
// The methods are domain operations (append to the outbox, read the feed,
// fence a checkpoint by a lease term), never SQL fragments, so that a
// document database with change streams can implement them as naturally as a
// relational one. Every call takes a context; a call that takes more than
// one value takes them in a params struct, so that parameters can be added
// without breaking implementations.
//
// Stability: this package is for backend authors. It may change between minor
// versions until 1.0; applications should use the ferry package instead.
package ferrydriver

import (
	"context"
	"errors"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Errors every implementation returns for the same conditions.
var (
	// ErrLeaseLost means the caller no longer holds the lease (another
	// holder took it over, or the term moved on). A fenced write was rejected.
	ErrLeaseLost = errors.New("lease lost: another relay holds this feed now")
	// ErrNotFound is returned when a named record does not exist.
	ErrNotFound = errors.New("not found")
	// ErrSchemaMissing is returned when Ferry's tables or collections have not
	// been created. The message of the wrapping error says how to create them.
	ErrSchemaMissing = errors.New("ferry schema is missing")
	// ErrMisconfigured is returned (wrapped) for a configuration the
	// backend cannot serve however often it is retried: a partition outside
	// the schema's partition count, a partition count that differs from
	// the one stored with the schema. The wrapping error names the setting
	// to fix. The relay stops with it instead of retrying.
	ErrMisconfigured = errors.New("ferry is misconfigured")
)

// Admin is what operators (the console, the CLI) need of a backend, on
// the outbox's side and on the inbox's: both Store and Inbox include it.
type Admin interface {
	// DeadLetterReasons groups the newest failures by their reason,
	// reading a bounded number of rows whatever the table holds: the
	// newest p.Scan relay dead letters (of p.Feed when set, as
	// ListDeadLettersParams.Feed) by feed partition and reason. The
	// console shows them so, and acts on a reason's events.
	DeadLetterReasons(ctx context.Context, p *ReasonsParams) (*Reasons, error)
	// InboxDeadReasons groups the newest p.Scan DEAD rows of p.Group by
	// their last error.
	InboxDeadReasons(ctx context.Context, p *ReasonsParams) (*Reasons, error)

	// InboxAttempts returns the history of an event's row in a group,
	// oldest first; nil when the group has no such row or it never
	// failed. The history is kept as long as the row: its failed
	// attempts, each with its error and what it left the row in, and the
	// operators' redrives of it, the latest 20 of them
	// (driverkit.AttemptHistory). Nothing is written for an attempt that
	// processed, nor on the path of one that did: the history costs
	// failures only. An attempt that ended with no report (its worker
	// crashed, or outlived its claim) has no entry of its own; the attempt
	// numbers around it show it. A row whose attempts such ends spent goes
	// DEAD with an entry of ReasonAttemptsExhausted, numbered with the
	// attempts it had.
	InboxAttempts(ctx context.Context, p *InboxAttemptsParams) ([]AttemptRecord, error)

	// InboxGroups lists the consumer groups: every group whose dead policy
	// is stored (each consumer stores it when it starts) or that has
	// events waiting (ingested before any of its consumers started:
	// holding, as consumers do without a stored policy), in name order,
	// at most 1,000 (driverkit.MaxListedGroups), with its policy.
	InboxGroups(ctx context.Context) ([]GroupPolicy, error)

	// RecordActivity stores samples of what relays and consumers did over
	// time, for the console: every running relay and consumer records a
	// sample of each interval it ran (how many events it published or
	// applied, how long they took), one write per component and process
	// every interval, whatever the throughput. It removes samples older
	// than p.Retention (a bounded number per call).
	RecordActivity(ctx context.Context, p *RecordActivityParams) error
	// ListActivity returns the samples recorded at p.Since or later,
	// oldest first, at most p.Limit (0 or more than ActivityListCap:
	// ActivityListCap).
	ListActivity(ctx context.Context, p *ListActivityParams) ([]*ActivitySample, error)
}

// Store is what the relay, the CLI and operators need from a backend: every
// operation that does not run inside a caller's transaction.
type Store interface {
	Admin

	// Name is a short backend name such as "postgres".
	Name() string
	// Capabilities reports what the backend can and cannot do.
	Capabilities() Capabilities

	// Append writes events to the outbox in a transaction of its own.
	// Each event must already be validated and have an ID and CreatedAt
	// (see ferryevent.Prepare).
	Append(ctx context.Context, events []*ferryevent.Event) error

	// Migrations lists the backend's schema migrations, oldest first.
	Migrations() []Migration
	// Migrate applies (or, with Down, reverts) migrations and reports which.
	Migrate(ctx context.Context, p *MigrateParams) (*MigrateResult, error)

	// OpenFeed opens the outbox of one partition for reading in commit order,
	// starting after p.Cursor (from the beginning when nil).
	OpenFeed(ctx context.Context, p *OpenFeedParams) (Feed, error)

	// LoadCheckpoint returns the saved position of a feed; a feed never saved
	// has a zero Checkpoint with a nil Cursor, not an error.
	LoadCheckpoint(ctx context.Context, feed string) (*Checkpoint, error)
	// SaveCheckpoint stores a feed position, fenced: it fails with
	// ErrLeaseLost unless p.Holder holds the lease p.Feed at p.Term.
	SaveCheckpoint(ctx context.Context, p *SaveCheckpointParams) error

	// AcquireLease takes the lease if it is free or expired (incrementing its
	// term) or renews it if p.Holder already holds it. It returns the lease as
	// it now stands; the caller holds it iff the returned Holder is p.Holder.
	AcquireLease(ctx context.Context, p *LeaseParams) (*Lease, error)
	// RenewLease extends a held lease; ErrLeaseLost if the term moved on.
	RenewLease(ctx context.Context, p *LeaseParams) (*Lease, error)
	// ReleaseLease gives a held lease up so that a standby can take over at
	// once. Releasing a lease one no longer holds is not an error.
	ReleaseLease(ctx context.Context, p *LeaseParams) error
	// GetLease returns the lease of a name, or ErrNotFound.
	GetLease(ctx context.Context, name string) (*Lease, error)

	// InsertDeadLetters stores events the relay could not publish, with the
	// reason, fenced like SaveCheckpoint. Inserting the same event twice for
	// the same feed keeps one record.
	InsertDeadLetters(ctx context.Context, p *InsertDeadLettersParams) error
	// ListDeadLetters lists relay dead letters, newest first.
	ListDeadLetters(ctx context.Context, p *ListDeadLettersParams) ([]*DeadLetter, error)
	// CountDeadLetters counts the relay dead letters ListDeadLetters
	// would list without a limit (p.After and p.Limit are ignored). It
	// reads every match: for a person asking, never for a periodic task.
	CountDeadLetters(ctx context.Context, p *ListDeadLettersParams) (int64, error)
	// GetDeadLetter returns one dead letter by event ID, or ErrNotFound.
	// An empty ref.Feed matches every feed, a feed's name its partitions
	// (as ListDeadLettersParams.Feed); the newest is returned when several
	// match.
	GetDeadLetter(ctx context.Context, ref DeadLetterRef) (*DeadLetter, error)
	// RedriveDeadLetters sends the named relay dead letters back to the
	// feed that dead-lettered each, and to no other: in one transaction it
	// appends each to its key's parked queue in that feed (see ParkEvents),
	// marked Redriven, and removes the dead letter, oldest failure first
	// (within a failure, in the key's order), and returns how many dead
	// letters it removed. The feed's relay finds them within a heartbeat
	// (ParkedHeads with Redriven) and publishes them as a parked key's
	// events: after the key's events it has already handed to its
	// destination, before the rest, in order. Other feeds of the
	// partition never see them, so their destinations get no copy. Each
	// event is published as it was dead-lettered: the same ID (brokers and
	// consumers that deduplicate drop a copy that did arrive) and Seq. An
	// event dead-lettered by several feeds goes back to each feed named. A
	// named dead letter that is no longer there (redriven or discarded
	// meanwhile) is not counted. If a named dead letter is not a valid
	// event (a record the feed could not decode), nothing changes and the
	// error names it: discard it.
	//
	// There is no filter and no "every feed": an operator's tool lists
	// what a filter matches (ListDeadLetters), shows it, and acts on
	// exactly the dead letters it listed, so that an action never reaches
	// a dead letter, or a feed, it did not show.
	RedriveDeadLetters(ctx context.Context, refs []DeadLetterRef) (int, error)
	// DiscardDeadLetters removes the named relay dead letters for good
	// and returns how many it removed.
	DiscardDeadLetters(ctx context.Context, refs []DeadLetterRef) (int, error)

	// DeleteDeadLetters removes p.Feed's dead letters that failed more
	// than p.OlderThan ago, oldest first, at most p.Limit of them: the
	// relay's retention of its dead letters. It reads O(p.Limit) entries
	// of an index on (feed, failed_at), however many dead letters are kept.
	DeleteDeadLetters(ctx context.Context, p *DeleteDeadLettersParams) (int64, error)

	// DeleteDelivered removes events of p.Partition that are older than
	// p.OlderThan and that every feed of the partition has passed (the
	// saved checkpoints, and p.Cursor), at most p.Limit of them. It never
	// removes an event a feed has not delivered.
	DeleteDelivered(ctx context.Context, p *DeleteDeliveredParams) (int64, error)

	// PruneKeys bounds the producers' per-key sequences, where producers
	// number events (a KeySeqStore's have none: the relay forgets its own
	// numbers with PruneKeySeqs, and PruneKeys has nothing to do): it
	// forgets the keys of
	// p.Partition that have had no new event for longer than p.IdleFor and
	// whose every event every feed of the partition has delivered (the
	// saved checkpoints, and p.Cursor), so that their next event starts
	// Seq at 1 again (see ferryevent.Event.Seq). It looks at p.Limit keys
	// after p.After in key order, by index, and returns where the sweep
	// goes on (Next; "" once it reached the end): O(p.Limit) per call,
	// however many keys there are. A key with a writer in flight is never
	// forgotten under it, and a writer that re-creates a key as it is
	// forgotten waits for the pruner or conflicts with it: same-key
	// writers stay serialised and each key's commit order stays the feed's
	// order.
	PruneKeys(ctx context.Context, p *PruneKeysParams) (*PruneKeysResult, error)

	// FeedLag measures how far a feed's saved checkpoint is behind the
	// newest event of its partition at a cost that does not grow with the
	// backlog or the history: the relay refreshes its lag gauges with it
	// every heartbeat. Beyond ExactCountLimit events it is an estimate
	// (see FeedLag.Events).
	FeedLag(ctx context.Context, p *FeedLagParams) (*FeedLag, error)

	// ListFeeds names the feeds the store knows of: every name with a
	// checkpoint, a lease, dead letters or parked events, in name order,
	// once each. Relay feeds are "<feed>/<partition>" (ferry.Relay).
	// It reads O(names) entries of indexes, however many dead letters and
	// parked events there are.
	ListFeeds(ctx context.Context) ([]string, error)

	// FeedStatus reports a feed's checkpoint, lease, lag and dead letters,
	// for operators. Without p.Exact it costs what FeedLag does plus a
	// count of at most ExactCountLimit+1 dead letters; with p.Exact it
	// counts every pending event and dead letter of the feed: O(lag +
	// dead letters), for a person asking, never for a periodic task.
	FeedStatus(ctx context.Context, p *FeedStatusParams) (*FeedStatus, error)

	// Parking sets a stuck key's events aside, so that the relay's
	// checkpoint can pass them while their destination hangs or fails: one
	// key's trouble then costs neither the other keys' latency nor the
	// relay's memory, and a crash does not redeliver what was published
	// behind the stuck key. A key's parked events form a queue in the
	// order they were parked; the relay parks a key's events in the order
	// it read them, publishes the head and removes it once acknowledged.
	// Writes are fenced like SaveCheckpoint, but for RedriveDeadLetters,
	// an operator's action: it appends dead letters to their keys' queues,
	// marked Redriven, and the relay of the feed takes those keys up at its
	// next heartbeat.
	//
	// ParkEvents appends events to their keys' queues of p.Feed.
	ParkEvents(ctx context.Context, p *ParkEventsParams) error
	// ParkedHeads returns the first parked event of each key named (all
	// parked keys of the feed when p.Keys is nil), at most one per key.
	ParkedHeads(ctx context.Context, p *ParkedHeadsParams) ([]*ParkedEvent, error)
	// UnparkEvent removes a key's head (published, or dead-lettered: then
	// p.DeadLetter is stored in the same transaction).
	UnparkEvent(ctx context.Context, p *UnparkEventParams) error
	// HoldParked marks a key's head held: the relay stops retrying it and
	// the key's later events wait, until ReleaseParked.
	HoldParked(ctx context.Context, p *HoldParkedParams) error
	// SetParkedAttempts records with a key's head (p.EventID) how many
	// attempts to publish it failed and when the first did, so that the
	// relay's MaxAttempts and MaxAge count across leaderships: the next
	// leader reads them back (ParkedEvent.Attempts, FirstFailure). Fenced;
	// a head no longer parked is no error. ReleaseParked resets them.
	SetParkedAttempts(ctx context.Context, p *SetParkedAttemptsParams) error
	// ReleaseParked lets the relay retry a held key's head again or, with
	// p.Skip, moves the head to the relay's dead letters and lets the key's
	// later events go. It is an operator's action and is not fenced.
	// ErrNotFound if the key has nothing parked.
	ReleaseParked(ctx context.Context, p *ReleaseParkedParams) error

	// ListLeases returns the leases whose name starts with prefix,
	// expired ones included (compare ExpiresAt with Now): relays that
	// share partitions through a ferry.Balancer count the live members of
	// their group with it.
	ListLeases(ctx context.Context, prefix string) ([]*Lease, error)

	// StoredPartitions returns the outbox's partition count, stored with
	// the schema (written when the schema is migrated). The store holds
	// every producer and relay to it: it refuses, with an error wrapping
	// ErrMisconfigured, a feed or an append by a process configured with
	// another count, and an OpenFeed of a partition outside the stored
	// range.
	StoredPartitions(ctx context.Context) (int, error)
	// SetPartitions changes the stored count. It refuses with
	// ErrPartitionChangeUnsafe unless no relay holds a feed of the outbox
	// and every feed has delivered every event of its partition (parked
	// events are not delivered, though the checkpoint passed them): then no
	// event written under the old count can be delivered after one written
	// under the new count, whose key may map to another partition.
	// Producers are held back while the change is checked and made. It
	// returns the count stored before the call.
	SetPartitions(ctx context.Context, p *SetPartitionsParams) (previous int, err error)
}

// ExactCountLimit is how many pending events FeedLag (and dead letters
// FeedStatus without Exact) count one by one. Beyond it the lag is
// extrapolated and the dead letters are reported as "more than".
const ExactCountLimit = 1000

// Driver is a Store that can also write events inside a caller's
// transaction of type TTx (pgx.Tx, *sql.Tx, a MongoDB session context).
type Driver[TTx any] interface {
	Store
	// AppendTx writes events to the outbox inside tx. If tx rolls back, so
	// do the events. Implementations must keep, for each key, the commit
	// order of the appending transactions (see ferrydrivertest).
	AppendTx(ctx context.Context, tx TTx, events []*ferryevent.Event) error
}

// Capabilities describes a backend's abilities; ferrydrivertest branches on
// them explicitly rather than skipping silently.
type Capabilities struct {
	// NotifyWakeups: the feed is woken by the database when events are
	// committed (LISTEN/NOTIFY, change streams), not only by polling.
	NotifyWakeups bool
	// ConcurrentWriters: several transactions can write the outbox at once
	// (false for SQLite, which has a single writer).
	ConcurrentWriters bool
}

// Migration is one numbered, reversible schema change.
type Migration struct {
	Version int
	Name    string
	// Up and Down are the statements (SQL for relational backends; a
	// description for others).
	Up, Down string
}

// MigrateParams selects the direction and how far to go.
type MigrateParams struct {
	// Down reverts instead of applying.
	Down bool
	// Steps limits the number of migrations; 0 means all (up) or one (down).
	Steps int
	// DryRun reports what would run without running it.
	DryRun bool
}

// MigrateResult lists the migrations that ran (or would run, for DryRun).
type MigrateResult struct {
	Applied []Migration
	// Current is the schema version after the call.
	Current int
}

// PruneKeysParams select what PruneKeys looks at.
type PruneKeysParams struct {
	Partition int
	// Cursor is the relay's saved checkpoint; a key goes only if it and
	// every saved checkpoint of the partition have passed its events.
	Cursor []byte
	// IdleFor is how long a key must have had no new event.
	IdleFor time.Duration
	// After is where the sweep goes on: keys after it, in key order; ""
	// starts from the first key.
	After string
	// Limit caps the keys looked at; 0 means 5,000.
	Limit int
}

// PruneKeysResult says what PruneKeys did.
type PruneKeysResult struct {
	// Pruned counts the keys forgotten.
	Pruned int64
	// Next is the After of the next call; "" when the sweep reached the
	// last key and starts over.
	Next string
}

// RetentionChunk is the most rows one retention statement removes when
// its Limit is 0 (DeleteDelivered, DeleteProcessedInbox, DeleteRequests),
// and the chunk Ferry's own retention passes ask for: a chunk is one short
// transaction, so retention never holds locks or a snapshot for long
// whatever history the tables keep.
const RetentionChunk = 5000

// DeleteDeliveredParams bound retention.
type DeleteDeliveredParams struct {
	Feed      string
	Partition int
	// Cursor is the feed's saved checkpoint; only events it has passed go.
	Cursor    []byte
	OlderThan time.Duration
	// Limit caps the rows removed; 0 means RetentionChunk.
	Limit int
}

// FeedLagParams select a feed.
type FeedLagParams struct {
	Feed      string
	Partition int
}

// FeedLag is a feed's lag behind its partition's newest event.
type FeedLag struct {
	// Events counts the events committed after the feed's checkpoint:
	// exactly when there are at most ExactCountLimit, otherwise an
	// estimate (Estimated). The backend counts the first ExactCountLimit
	// events after the checkpoint and extrapolates their density over the
	// positions up to the partition's newest event. The estimate is off
	// when the density is uneven: positions used by rolled-back
	// transactions or by other partitions (PostgreSQL draws the ids of all
	// partitions from one sequence), bursts and lulls (MongoDB measures
	// positions by append time). Like the exact count, it leaves out
	// events of transactions that were still running below the
	// checkpoint's position: the feed delivers them in its next batches.
	Events int64
	// Estimated is set when Events was extrapolated.
	Estimated bool
	// OldestPending is the earliest creation time among the first
	// ExactCountLimit events after the checkpoint; zero if none.
	OldestPending time.Time
	// Now is the database clock at the time of the measurement.
	Now time.Time
}

// FeedStatusParams select a feed.
type FeedStatusParams struct {
	Feed      string
	Partition int
	// Exact counts every pending event and dead letter of the feed, at a
	// cost that grows with both; without it LagEvents is FeedLag's
	// estimate and dead letters are counted up to ExactCountLimit.
	Exact bool
}

// FeedStatus describes a feed for operators.
type FeedStatus struct {
	Feed       string
	Checkpoint *Checkpoint
	// Lease is nil when no relay ever held the feed.
	Lease *Lease
	// LagEvents counts events committed but not yet passed by the
	// checkpoint: an estimate when LagEstimated (see FeedLag.Events).
	LagEvents int64
	// LagEstimated is set when LagEvents was extrapolated, not counted.
	LagEstimated bool
	// OldestPending is the creation time of the oldest such event (without
	// Exact, of the oldest among the first ExactCountLimit); zero if none.
	OldestPending time.Time
	// DeadLetters counts relay dead letters of the feed; when
	// DeadLettersMore, counting stopped there and the feed has more.
	DeadLetters     int64
	DeadLettersMore bool
	// Now is the database clock at the time of the report.
	Now time.Time
}

// OutboxTxReporter is implemented by backends that can name the open
// transactions that wrote to the outbox: their events are published when
// they commit, so one left open (a slow request, a session idle in
// transaction) is why an event emitted in it has not arrived.
type OutboxTxReporter interface {
	// OldestOutboxTx returns the oldest open transaction that wrote to the
	// outbox, or nil when there is none.
	OldestOutboxTx(ctx context.Context) (*OpenTx, error)
}

// OpenTx is an open database transaction.
type OpenTx struct {
	PID         int
	Started     time.Time
	State       string // "active", "idle in transaction", ...
	Application string
	// Now is the database clock when it was seen.
	Now time.Time
}
