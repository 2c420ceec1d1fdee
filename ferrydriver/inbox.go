package ferrydriver

import (
	"context"
	"errors"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

// InboxState is the state of one (consumer group, event) in the inbox.
type InboxState string

// Inbox states. PENDING → PROCESSING → PROCESSED, or FAILED (will run again
// at NextAttemptAt) → PROCESSING ..., or DEAD (gave up). RETRACTED marks an
// event whose source was undone (a chain reorg).
const (
	InboxPending    InboxState = "pending"
	InboxProcessing InboxState = "processing"
	InboxProcessed  InboxState = "processed"
	InboxFailed     InboxState = "failed"
	InboxDead       InboxState = "dead"
	InboxRetracted  InboxState = "retracted"
)

// ErrClaimLost means the worker's claim on an inbox row expired and the row
// may be with another worker: the handler's transaction must roll back.
var ErrClaimLost = errors.New("inbox claim lost: the row's lease expired and another worker may have it")

// Inbox is implemented by backends that keep consumer inboxes. Each
// (group, event ID) is recorded once; rows of one key run one at a time, in
// the order they were inserted; rows of different keys run in parallel.
type Inbox[TTx any] interface {
	// InsertInbox records events for a group, ignoring those already
	// recorded (atomically: concurrent duplicates insert once). Events of
	// one key must be inserted in delivery order.
	InsertInbox(ctx context.Context, p *InsertInboxParams) (*InsertInboxResult, error)
	// ClaimInbox claims up to p.Limit runnable rows, at most one per key and
	// always a key's oldest unfinished row, marking them PROCESSING for
	// p.Worker until p.TTL from now.
	ClaimInbox(ctx context.Context, p *ClaimInboxParams) ([]*InboxRow, error)
	// RunInTx runs fn in a new transaction of the consumer's database and
	// commits it if fn returns nil.
	RunInTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error
	// CompleteInboxTx marks a claimed row PROCESSED inside tx, the
	// transaction of the handler's own writes; ErrClaimLost if the claim
	// is no longer p.Worker's.
	CompleteInboxTx(ctx context.Context, tx TTx, p *CompleteInboxParams) error
	// FailInbox records a failed attempt: FAILED until p.RetryAt, or DEAD
	// when p.Dead. ErrClaimLost if the claim is no longer p.Worker's.
	FailInbox(ctx context.Context, p *FailInboxParams) error
}

// InsertInboxParams are events received for a group.
type InsertInboxParams struct {
	Group  string
	Events []*ferryevent.Event
}

// InsertInboxResult says which events were new.
type InsertInboxResult struct {
	// Inserted has one entry per event: false for a duplicate.
	Inserted []bool
}

// ClaimInboxParams ask for work.
type ClaimInboxParams struct {
	Group  string
	Worker string
	Limit  int
	TTL    time.Duration
	// HoldDead: a DEAD row holds its key's later rows back (the group's
	// policy is Hold); false lets them run (Continue).
	HoldDead bool
}

// InboxRow is one claimed (or listed) inbox row.
type InboxRow struct {
	Group         string
	Event         ferryevent.Event
	State         InboxState
	Attempts      int
	LastError     string
	NextAttemptAt time.Time
	ReceivedAt    time.Time
	FinishedAt    time.Time
}

// CompleteInboxParams finish a claimed row.
type CompleteInboxParams struct {
	Group    string
	EventID  uuid.UUID
	Worker   string
	HoldDead bool // the group's policy, as in ClaimInboxParams
}

// FailInboxParams record a failed attempt.
type FailInboxParams struct {
	Group   string
	EventID uuid.UUID
	Worker  string
	Error   string
	RetryAt time.Time
	Dead    bool
	// HoldDead: the group's policy, as in ClaimInboxParams.
	HoldDead bool
}
