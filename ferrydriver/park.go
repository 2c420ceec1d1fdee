package ferrydriver

import (
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

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
