package ferrydriver

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	InboxDiscarded  InboxState = "discarded"
	InboxRetracted  InboxState = "retracted"
)

// InboxStates lists every inbox state, in the order above.
var InboxStates = []InboxState{InboxPending, InboxProcessing, InboxProcessed, InboxFailed, InboxDead, InboxDiscarded, InboxRetracted}

// Valid reports whether s is one of InboxStates.
func (s InboxState) Valid() bool { return slices.Contains(InboxStates, s) }

// ErrClaimLost means the claim on an inbox row is no longer the caller's:
// it expired (and the row may be with another attempt), or a later claim
// took the row over. The handler's transaction must roll back.
var ErrClaimLost = errors.New("inbox claim lost: the claim expired or a later attempt took the row over")

// ClaimsLostError is what RunInTx returns when the transaction recorded
// outcomes (CompleteInboxTx, InboxBatcher.FinishInboxTx) whose claims were
// found lost at its commit: a backend may send those with the COMMIT, in
// one round trip, and the transaction then rolls back. Lost names the
// rows (as far as could be read after the rollback). It wraps
// ErrClaimLost.
type ClaimsLostError struct {
	Lost []uuid.UUID
}

func (e *ClaimsLostError) Error() string {
	return fmt.Sprintf("the inbox claims of %d events were lost at commit (they expired, or a later attempt took them over): the transaction rolled back", len(e.Lost))
}

func (e *ClaimsLostError) Unwrap() error { return ErrClaimLost }

// ErrTxNotBegun wraps the error of a transaction that could not begin (no
// connection within the deadline, say). From RunInTx it means the handler
// did not run, and the attempt does not count (FailInboxParams.Uncounted).
var ErrTxNotBegun = errors.New("the transaction could not begin")

// InboxIngestClaimer is implemented by inboxes that can claim, in the
// statement (or transaction) that records deliveries, the new rows of keys
// that had nothing to do: the consumer that ingests them then runs them at
// once, without a claim of its own to find them (a round trip and a
// statement fewer per delivery, and no wait for the claim loop).
// ferrydrivertest.ExerciseInboxIngestClaims is its suite.
type InboxIngestClaimer interface {
	// InsertInboxClaim is InsertInbox that also claims, as ClaimInbox
	// would (c.Worker, c.TTL, one token), the inserted rows of each key
	// that had no unfinished row, no claim, no hold and no rescue due
	// before them: up to c.Keys such keys (in key order), and of each its
	// first c.PerKey inserted rows; the key's later rows wait for the
	// claim's finish like rows delivered during a claim. It returns
	// InsertInbox's result and the claimed rows (PROCESSING, first
	// attempt), ordered by key, then position.
	InsertInboxClaim(ctx context.Context, p *InsertInboxParams, c *IngestClaimParams) (inserted []bool, claimed []*InboxRow, err error)
}

// IngestClaimParams bound what InsertInboxClaim claims.
type IngestClaimParams struct {
	Worker string
	TTL    time.Duration
	// Keys bounds the keys claimed, PerKey the rows of each (at least 1).
	Keys, PerKey int
}

// InboxBatcher is implemented by inboxes that can apply several claimed
// rows in one transaction of the consumer's database (ConsumerConfig.
// BatchSize): each handler runs inside a savepoint of it, and the outcomes
// are recorded with set-based statements before the one commit.
type InboxBatcher[TTx any] interface {
	// Savepoint runs fn inside a savepoint of tx. When fn fails, whatever
	// it did in tx is rolled back and tx stays usable; fn's error is
	// returned. An error of the savepoint itself is returned wrapped with
	// ErrSavepoint: tx is then unusable.
	Savepoint(ctx context.Context, tx TTx, fn func(ctx context.Context, tx TTx) error) error
	// FinishInboxTx records the outcomes of claimed rows inside tx, the
	// transaction of their handlers' writes, and recomputes their keys'
	// heads: PROCESSED, FAILED until RetryAt, or DEAD. A key's rows are
	// reported in the order they were claimed, and none after one that
	// failed (or went DEAD under Hold): the rows of a claim it does not
	// name run again, uncounted. It returns the event IDs whose claim was
	// lost (expired, or taken over); the caller must then roll tx back,
	// since those rows' handlers' writes are in it. In a transaction of
	// RunInTx, a backend may send it with the commit instead (and return
	// no lost IDs here): a lost claim then makes RunInTx roll back and
	// return a *ClaimsLostError.
	FinishInboxTx(ctx context.Context, tx TTx, p *FinishInboxParams) (lost []uuid.UUID, err error)
}

// ErrSavepoint wraps a failure of a savepoint statement itself (not of the
// function run inside it): the transaction cannot go on.
var ErrSavepoint = errors.New("savepoint failed")

// FinishInboxParams are the outcomes of claimed rows of one group.
type FinishInboxParams struct {
	Group string
	Rows  []FinishedRow
}

// FinishedRow is the outcome of one claimed row.
type FinishedRow struct {
	EventID uuid.UUID
	// Claim is InboxRow.Claim of the attempt.
	Claim string
	// State is InboxProcessed, InboxFailed or InboxDead.
	State InboxState
	// Error and RetryAt are recorded for InboxFailed (RetryAt) and
	// InboxDead.
	Error   string
	RetryAt time.Time
	// Uncounted takes the claim's attempt back (InboxFailed): the event is
	// given back without having failed.
	Uncounted bool
}

// InboxCountCap bounds each count of InboxCounts, so that metrics cost the
// same whatever the backlog: a state with more rows reads as the cap.
const InboxCountCap = 10_000

// ReasonAttemptsExhausted is the error recorded for a row that ClaimInbox
// makes DEAD instead of claiming it again (ClaimInboxParams.MaxAttempts).
const ReasonAttemptsExhausted = "attempts exhausted; the last ones lost their claim or crashed the process"

// Inbox is implemented by backends that keep consumer inboxes. Each
// (group, event ID) is recorded once; rows of one key run one at a time, in
// the order they were inserted; rows of different keys run in parallel.
type Inbox[TTx any] interface {
	// InsertInbox records events for a group, ignoring those already
	// recorded (atomically: concurrent duplicates insert once). Events of
	// one key must be inserted in delivery order. It returns one entry
	// per event: false for a duplicate.
	InsertInbox(ctx context.Context, p *InsertInboxParams) ([]bool, error)
	// ClaimInbox claims up to p.Limit runnable rows: of each key, its oldest
	// unfinished row, and with p.PerKey > 1 (where the backend can) up to
	// p.PerKey of its rows in order, stopping before the first that cannot
	// run now. They are PROCESSING for p.Worker until p.TTL from now, the
	// attempt counts, and the claim has a token of its own (InboxRow.Claim)
	// that fences every later change of the rows. Runnable: PENDING, or FAILED and due. A key with a row
	// claimed (or whose claim expired) is not claimed again until it is
	// finished or rescued. With p.Rescue, one row of a key whose claim
	// expired is claimed instead, alone: the head of what the expired claim
	// covered. A head whose attempts already reached p.MaxAttempts is not
	// claimed: it is made DEAD with ReasonAttemptsExhausted, its key follows
	// the group's stored dead policy, and it is returned with State
	// InboxDead so that the caller reports it. Rows are returned grouped by
	// key, each key's in order. Rows returned with an error were claimed
	// all the same (a step after the claim failed): the caller runs them.
	ClaimInbox(ctx context.Context, p *ClaimInboxParams) ([]*InboxRow, error)
	// RescueDue reports whether a claim of the group has expired (a row
	// for ClaimInbox with Rescue). It reads an index of the rows being
	// processed only.
	RescueDue(ctx context.Context, group string) (bool, error)
	// RunInTx runs fn in a new transaction of the consumer's database and
	// commits it if fn returns nil.
	RunInTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error
	// CompleteInboxTx marks a claimed row PROCESSED inside tx, the
	// transaction of the handler's own writes; ErrClaimLost unless p.Claim
	// is the row's current claim and has not expired. In a transaction of
	// RunInTx, a backend may send it with the commit instead: a lost claim
	// then makes RunInTx roll back and return a *ClaimsLostError.
	CompleteInboxTx(ctx context.Context, tx TTx, p *CompleteInboxParams) error
	// FailInbox records a failed attempt: FAILED until p.RetryAt, or DEAD
	// when p.Dead. ErrClaimLost unless p.Claim is the row's current claim
	// and has not expired. The attempt counts (as the claim said it would:
	// InboxRow.Attempts of a claimed row includes it).
	FailInbox(ctx context.Context, p *FailInboxParams) error

	// SetInboxPolicy stores a group's dead policy; if it changed, every key
	// of the group is re-evaluated under the new one. A backend that does
	// that in several transactions stores how far it got with the policy:
	// a call interrupted part-way (a cancelled context, a killed process,
	// a failed statement) leaves the sweep pending, and the next call,
	// with the same policy or not, finishes it. It holds a chunk of keys
	// in memory at a time, never all of a group's. Consumers call it when
	// they start. The stored policy is the only one: every call that can
	// make a row DEAD or release a key (ClaimInbox, CompleteInboxTx,
	// FailInbox, RedriveInbox, DiscardInbox, RetractInbox) reads it; a group
	// with none stored holds (a DEAD row holds its key's later rows back).
	// A claim made while the change is under way may run the rows it took
	// under the old policy; what a key does after that claim finishes
	// follows the new one.
	SetInboxPolicy(ctx context.Context, p *InboxPolicyParams) error
	// ListInbox lists inbox rows (dead letters, typically), newest first.
	ListInbox(ctx context.Context, p *ListInboxParams) ([]*InboxRow, error)
	// RedriveInbox makes DEAD rows PENDING again with their attempts reset;
	// they run in their key's order. It returns how many rows changed.
	RedriveInbox(ctx context.Context, p *InboxIDsParams) (int, error)
	// DiscardInbox gives DEAD rows up for good (DISCARDED), releasing the
	// keys they held. It returns how many rows changed.
	DiscardInbox(ctx context.Context, p *InboxIDsParams) (int, error)
	// InboxCounts counts a group's unfinished rows (PENDING, PROCESSING,
	// FAILED, DEAD) by state, each up to InboxCountCap (a state with more
	// reads as the cap): O(cap) whatever the backlog, for metrics.
	InboxCounts(ctx context.Context, group string) (map[InboxState]int64, error)
	// DeleteProcessedInbox removes PROCESSED rows finished before
	// p.OlderThan ago, at most p.Limit, and forgets keys with nothing left;
	// it returns how many rows it removed.
	DeleteProcessedInbox(ctx context.Context, p *DeleteProcessedInboxParams) (int64, error)

	Admin

	// RetractInbox marks events of a group RETRACTED, their source undone
	// (a chain reorg orphaned their block), in one transaction:
	//   - a row not yet finished (PENDING, FAILED, PROCESSING, DEAD) never
	//     runs; a worker still running it finds its claim lost;
	//   - a PROCESSED row is retracted and its Compensation is inserted at
	//     the end of its key's queue, so that the group's retraction
	//     handler runs once, in key order;
	//   - an event the group never received is recorded as RETRACTED, so
	//     that a late delivery of it is ignored.
	// Retracting an event again changes nothing. It returns each event's
	// state before the call, in the order of p.Retractions ("" when it was
	// absent).
	RetractInbox(ctx context.Context, p *RetractInboxParams) ([]InboxState, error)

	// ClaimHolders lists the workers (ClaimInboxParams.Worker) holding
	// unexpired claims of the group. It reads the group's claims only.
	ClaimHolders(ctx context.Context, group string) ([]string, error)
	// ExpireClaims makes worker's unexpired claims of the group expire now
	// and returns how many it ended: a consumer process whose membership
	// of its group (a lease it renews) lapsed has crashed or is cut off,
	// and the group's other processes take its events over at once instead
	// of after ClaimTTL. The claims ended are expired claims like any
	// other: their rows are rescued (ClaimInbox with Rescue), and a late
	// commit under them is refused (ErrClaimLost). A claim it cannot take
	// at once (another transaction holds its key) is left for a later
	// call.
	ExpireClaims(ctx context.Context, p *ExpireClaimsParams) (int, error)

	// MaxConns is the most connections the backend's pool opens for
	// handlers' transactions, 0 when it sets no bound a consumer should
	// size its workers by: a consumer warns at Run when the pool cannot
	// serve its workers' handlers plus its claims and upkeep.
	MaxConns() int

	Settler
}

// Settler answers whether consumer groups have settled events. It reads on
// connections of its own, never through a caller's transaction snapshot.
type Settler interface {
	// InboxStates reads the current state of events for a group; events
	// never received are absent.
	InboxStates(ctx context.Context, p *InboxIDsParams) (map[uuid.UUID]*InboxRow, error)
	// AwaitSettled waits until every event is finished (PROCESSED, DEAD,
	// DISCARDED, RETRACTED) or p.Deadline passes, woken by the database when
	// one of them finishes; it never polls. It returns the last known row
	// of each event (absent: not received yet).
	AwaitSettled(ctx context.Context, p *AwaitSettledParams) (map[uuid.UUID]*InboxRow, error)
}

// ListInboxParams filter inbox rows.
type ListInboxParams struct {
	Group string
	// States selects rows in these states; empty means DEAD.
	States []InboxState
	// Key and Type filter exactly when set.
	Key, Type string
	// EventIDs, when set, selects only these events.
	EventIDs []uuid.UUID
	// Since and Until bound the time the row finished (failed, for DEAD).
	Since, Until time.Time
	// Limit caps the result; 0 means 100.
	Limit int
	// After, when set, lists the rows that come after it in the list's
	// order (finish time, then receipt time, newest first, then event ID):
	// the next page. Only for finished states (DEAD, PROCESSED, DISCARDED,
	// RETRACTED), which have a finish time.
	After *InboxCursor
}

// InboxCursor is where a page of ListInbox ended: its last row's finish
// and receipt times and event ID.
type InboxCursor struct {
	FinishedAt, ReceivedAt time.Time
	EventID                uuid.UUID
}

// InboxPolicyParams set a group's dead policy.
type InboxPolicyParams struct {
	Group    string
	HoldDead bool
	// BeforeChunk, when set, is called before each chunk of keys a
	// backend that re-evaluates them in several transactions starts
	// (chunk counts from 0): the suite's seam to interrupt a change
	// part-way. Backends that do it in one transaction never call it.
	BeforeChunk func(chunk int)
}

// StartChunk calls p.BeforeChunk, if set: backends call it before each
// chunk of a policy change's sweep.
func (p *InboxPolicyParams) StartChunk(chunk int) {
	if p.BeforeChunk != nil {
		p.BeforeChunk(chunk)
	}
}

// InboxIDsParams name events of a group.
type InboxIDsParams struct {
	Group    string
	EventIDs []uuid.UUID
}

// DeleteProcessedInboxParams bound inbox retention.
type DeleteProcessedInboxParams struct {
	Group     string
	OlderThan time.Duration
	// Limit caps the rows removed; 0 means RetentionChunk.
	Limit int
}

// AwaitSettledParams name the events to wait for.
type AwaitSettledParams struct {
	Group    string
	EventIDs []uuid.UUID
	Deadline time.Time
}

// Finished reports whether a row in state s will not run again.
func (s InboxState) Finished() bool {
	switch s {
	case InboxProcessed, InboxDead, InboxDiscarded, InboxRetracted:
		return true
	}
	return false
}

// InsertInboxParams are events received for a group.
type InsertInboxParams struct {
	Group  string
	Events []*ferryevent.Event
}

// ClaimInboxParams ask for work.
type ClaimInboxParams struct {
	Group  string
	Worker string
	// Limit bounds the rows claimed.
	Limit int
	// PerKey bounds the rows claimed of one key (a run of its next rows,
	// in order); 0 or 1: its head only.
	PerKey int
	// Keys bounds the keys claimed; 0: Limit.
	Keys int
	TTL  time.Duration
	// MaxAttempts bounds the attempts of a row: one that already had as
	// many (they lost their claims) goes DEAD instead. 0: no bound.
	MaxAttempts int
	// Rescue claims rows whose last claim expired (their worker crashed, or
	// outlived the claim) instead of PENDING and FAILED ones, one per key.
	// The consumer runs them with nothing else running, in groups that
	// halve with each crash they were in and alone on a row's last
	// attempt, so that an event that crashes its process is found, and no
	// other event goes DEAD for it.
	Rescue bool
}

// InboxRow is one claimed (or listed) inbox row.
type InboxRow struct {
	Group string
	Event ferryevent.Event
	State InboxState
	// Attempts counts the row's claims (this one included, for a claimed
	// row) since it was received or redriven.
	Attempts int
	// Claim is the token of the claim that ClaimInbox just made (empty
	// otherwise): CompleteInboxTx and FailInbox present it. It is opaque:
	// a backend may add to it what a finish of the row needs to know.
	Claim         string
	LastError     string
	NextAttemptAt time.Time
	ReceivedAt    time.Time
	FinishedAt    time.Time
}

// CompleteInboxParams finish a claimed row.
type CompleteInboxParams struct {
	Group   string
	EventID uuid.UUID
	// Claim is InboxRow.Claim of the attempt.
	Claim string
	// Keep keeps the claim on the key's later rows of the same claim,
	// which the caller runs next, each in a transaction of its own, in
	// order (a run of a key's events claimed together: ClaimInboxParams.
	// PerKey). Without it, those rows run again, uncounted.
	Keep bool
}

// FailInboxParams record a failed attempt.
type FailInboxParams struct {
	Group   string
	EventID uuid.UUID
	// Claim is InboxRow.Claim of the attempt.
	Claim   string
	Error   string
	RetryAt time.Time
	Dead    bool
	// Uncounted takes the claim's attempt back: the handler never ran
	// (ErrTxNotBegun).
	Uncounted bool
}

// ExpireClaimsParams name a worker's claims of a group to end.
type ExpireClaimsParams struct {
	Group, Worker string
}

// InboxAttemptsParams name an event's row in a group.
type InboxAttemptsParams struct {
	Group   string
	EventID uuid.UUID
}

// GroupPolicy is a consumer group and its stored dead policy.
type GroupPolicy struct {
	Group string
	// HoldDead: a key's later events wait behind a DEAD one.
	HoldDead bool
}

// AttemptRecord is one entry of a row's history (Admin.InboxAttempts).
type AttemptRecord struct {
	// Attempt is the row's attempt that the entry closes: 1 for its first,
	// and from 1 again after a redrive. A redrive's is the count of
	// attempts that it reset.
	Attempt int
	// State is what the attempt left the row in: FAILED (retried later) or
	// DEAD; PENDING for a redrive. A failed attempt of a row that a batch
	// ran after an earlier row of its key stopped reads FAILED: the row is
	// given back, its attempt counted.
	State InboxState
	// Error is the attempt's error, its first 2,048 characters
	// (driverkit.AttemptErrorChars; InboxRow.LastError holds all of the
	// last one).
	Error string
	At    time.Time
}

// RetractInboxParams name the events to retract.
type RetractInboxParams struct {
	Group       string
	Retractions []Retraction
}

// Retraction is one event to retract and, should the group have processed
// it, the event that compensates it (same Key; its own ID, stable across
// attempts, so that it is inserted once).
type Retraction struct {
	Event        *ferryevent.Event
	Compensation *ferryevent.Event
}
