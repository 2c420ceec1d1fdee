package ferrydriver

import (
	"context"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
)

// OpenFeedParams open a feed.
type OpenFeedParams struct {
	// Feed names the feed (checkpoint and lease name), e.g. "default/0".
	Feed string
	// Partition is the outbox partition this feed reads.
	Partition int
	// Cursor is the last saved checkpoint; nil reads from the beginning.
	Cursor []byte
}

// Feed reads one outbox partition in commit order. It is used by one
// goroutine at a time.
type Feed interface {
	// Read returns up to p.Max events after the feed's position and advances
	// the position. When none are ready it waits up to p.Wait for a wake-up,
	// then returns what it has, possibly an empty batch whose Cursor still
	// moved (a quiet feed's position must keep up with the database).
	//
	// A failed Read returns a nil Batch and an error, and does not advance
	// the position: nothing of a failed read is ever returned, so no event
	// is lost by retrying. The caller may Read again (implementations
	// reconnect as needed) or Close the feed and open a new one from its
	// checkpoint.
	Read(ctx context.Context, p *ReadParams) (*Batch, error)
	// Close releases the feed's resources (connections, cursors).
	Close() error
}

// ReadParams bound one Read.
type ReadParams struct {
	Max  int
	Wait time.Duration
}

// Batch is one read's worth of events.
type Batch struct {
	// Events are in commit order per key; events of different keys may be
	// in any order relative to each other.
	Events []*ferryevent.Event
	// Cursor is the feed position after this batch. Saving it as the
	// checkpoint asserts that every event of this and all earlier batches
	// was acknowledged by the sink or dead-lettered.
	Cursor []byte
	// Invalid are stored records that could not be decoded into events; the
	// relay dead-letters them with the reason instead of stopping.
	Invalid []*InvalidRecord
}

// InvalidRecord is a stored outbox record that is not a valid event.
type InvalidRecord struct {
	Event  ferryevent.Event // whatever could be read
	Reason string
}

// Checkpoint is a saved feed position.
type Checkpoint struct {
	Feed      string
	Cursor    []byte
	Term      int64
	UpdatedAt time.Time
}

// SaveCheckpointParams store a position under a lease.
type SaveCheckpointParams struct {
	Feed string
	// Partition is the outbox partition the feed reads; retention keeps
	// what any feed of the partition has not delivered.
	Partition int
	Cursor    []byte
	Holder    string
	Term      int64
	// Seqs are the keys' last sequence numbers the relay gave events up to
	// Cursor, for the keys it numbered since the last save (see
	// KeySeqStore). A store that keeps key sequences writes them in the
	// same transaction as the cursor, so that the two never disagree; other
	// stores get none.
	Seqs map[string]int64
}

// KeySeqStore is implemented by stores whose feeds leave Seq to the relay:
// their events arrive with Seq zero, and the relay numbers each key's
// events in the order the feed returns them, which is the key's commit
// order. The numbers given up to a checkpoint are saved with it
// (SaveCheckpointParams.Seqs), so that a new leader, reading again from
// the checkpoint, gives every event it delivers again the number it had.
// An event that arrives with a Seq (written before the store left numbering
// to the relay) keeps it.
type KeySeqStore interface {
	// LoadKeySeqs returns the last Seq saved with feed's checkpoint for
	// each of keys that has one; a key without is absent.
	LoadKeySeqs(ctx context.Context, feed string, keys []string) (map[string]int64, error)
	// PruneKeySeqs forgets the saved numbers of p.Feed's keys that no
	// save has touched for p.IdleFor, but those of p.Keep: their next event
	// starts Seq at 1 again. It looks at p.Limit keys after p.After in key
	// order, by index: O(p.Limit) per call, however many keys there are.
	// The relay calls it from the goroutine that numbers events, and keeps
	// the keys whose numbers it has not saved yet, so that no key is
	// forgotten under an event the relay numbered.
	PruneKeySeqs(ctx context.Context, p *PruneKeySeqsParams) (*PruneKeySeqsResult, error)
}

// PruneKeySeqsParams bound one PruneKeySeqs call.
type PruneKeySeqsParams struct {
	Feed    string
	IdleFor time.Duration
	// After is where the sweep goes on ("" from the first key); Limit caps
	// the keys looked at.
	After string
	Limit int
	// Keep are keys not to forget, idle or not.
	Keep []string
}

// PruneKeySeqsResult says what PruneKeySeqs forgot and where the sweep goes
// on ("" once it reached the last key).
type PruneKeySeqsResult struct {
	Pruned []string
	Next   string
}

// Lease gives one holder a name for a while; Term increases every time the
// lease changes hands (or is taken again after expiring).
type Lease struct {
	Name      string
	Holder    string
	Term      int64
	ExpiresAt time.Time
	// Now is the database's clock when the lease was read; compare it with
	// ExpiresAt rather than comparing ExpiresAt with the local clock.
	Now time.Time
}

// Held reports whether holder holds l and it has not expired.
func (l *Lease) Held(holder string) bool {
	return l != nil && l.Holder == holder && l.ExpiresAt.After(l.Now)
}

// LeaseParams name a lease and its holder, for AcquireLease, RenewLease
// and ReleaseLease.
type LeaseParams struct {
	Name   string
	Holder string
	// Term is the term the holder holds (RenewLease, ReleaseLease: the
	// call is fenced by it); AcquireLease ignores it.
	Term int64
	// TTL is how long the lease lasts from now (AcquireLease,
	// RenewLease); ReleaseLease ignores it.
	TTL time.Duration
}
