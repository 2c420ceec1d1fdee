package ferrydriver

import (
	"context"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

// Parker is implemented by stores that can set a stuck key's events aside,
// so that the relay's checkpoint can pass them while their destination
// hangs or fails: one key's trouble then costs neither the other keys'
// latency nor the relay's memory, and a crash does not redeliver what was
// published behind the stuck key.
//
// A key's parked events form a queue in the order they were parked; the
// relay parks a key's events in the order it read them, publishes the head
// and removes it once acknowledged. Writes are fenced like SaveCheckpoint,
// but for Store.RedriveDeadLetters, an operator's action: it appends
// dead letters to their keys' queues, marked Redriven, and the relay of
// the feed takes those keys up at its next heartbeat.
// A store without Parker still keeps keys apart, but a stuck key holds the
// relay's checkpoint (and, once its read-ahead window is full, everything).
type Parker interface {
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
}

// ParkedEvent is one event set aside for its key.
type ParkedEvent struct {
	Feed  string
	Event ferryevent.Event
	// ParkedAt is when the relay set it aside.
	ParkedAt time.Time
	// Held is set once the relay gave up retrying it (HoldParked).
	Held bool
	// Reason is the last publish error.
	Reason string
	// Queued is the number of the key's parked events, this one included
	// (filled by ParkedHeads).
	Queued int64
	// Redriven is set on an event an operator redrove (RedriveDeadLetters)
	// and the relay has not published since.
	Redriven bool
	// Attempts is the number of failed attempts to publish it, and
	// FirstFailure when the first of them was made (zero: none), as
	// SetParkedAttempts recorded them.
	Attempts     int
	FirstFailure time.Time
}

// SetParkedAttemptsParams record a parked head's failed attempts, fenced.
type SetParkedAttemptsParams struct {
	Feed         string
	Holder       string
	Term         int64
	Key          string
	EventID      uuid.UUID
	Attempts     int
	FirstFailure time.Time
}

// ParkEventsParams append events to their keys' queues, fenced.
type ParkEventsParams struct {
	Feed   string
	Holder string
	Term   int64
	// Events are in the order to keep per key.
	Events []*ferryevent.Event
	// Reason is why the keys were set aside (the last publish error).
	Reason string
}

// ParkedHeadsParams select heads.
type ParkedHeadsParams struct {
	Feed string
	Keys []string
	// Redriven, when Keys is nil, selects only the keys that have a
	// redriven event (RedriveDeadLetters) in their queue: the relay looks
	// for them every heartbeat, at a cost of the redriven events waiting,
	// however long the other keys' queues are.
	Redriven bool
	// Limit caps the result when Keys is nil; 0 means 1000.
	Limit int
}

// UnparkEventParams remove a key's head, fenced.
type UnparkEventParams struct {
	Feed    string
	Holder  string
	Term    int64
	Key     string
	EventID uuid.UUID
	// DeadLetter, when set, is stored with the removal.
	DeadLetter *DeadLetter
}

// HoldParkedParams mark a key's head held, fenced.
type HoldParkedParams struct {
	Feed    string
	Holder  string
	Term    int64
	Key     string
	EventID uuid.UUID
	Reason  string
}

// ReleaseParkedParams release a held key.
type ReleaseParkedParams struct {
	Feed string
	Key  string
	// Skip dead-letters the head instead of retrying it.
	Skip bool
}

// LeaseLister is implemented by stores that can list leases by name
// prefix. Relays that share partitions through a ferry.Balancer use it to
// count the live members of their group.
type LeaseLister interface {
	// ListLeases returns the leases whose name starts with prefix,
	// expired ones included (compare ExpiresAt with Now).
	ListLeases(ctx context.Context, prefix string) ([]*Lease, error)
}
