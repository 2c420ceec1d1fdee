// How a consumer group is configured: its dead policy, savepoints,
// limits and timings, with their defaults and checks.

package ferry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferry-dev/ferry/ferryhook"
)

// DeadPolicy says what happens to a key's later events when one of its
// events goes DEAD.
type DeadPolicy int

const (
	// Hold keeps the key's later events waiting until the dead event is
	// redriven or discarded: the key's order is kept. The default.
	Hold DeadPolicy = iota
	// Continue lets the key's later events run.
	Continue
)

// ConsumerConfig configures a Consumer. Group is required.
type ConsumerConfig struct {
	// Group names the consumer group: its inbox, its checkpoint on a feed
	// source, its settlement answers. Required.
	Group string
	// Workers is how many transactions run at once (never two events of
	// one key). Default 8.
	Workers int
	// BatchSize is how many claimed events one transaction may apply: a
	// failing handler's effects are rolled back and recorded as that
	// event's failed attempt, and the others commit (see SavepointEach
	// for how). A batch holds runs of one or more keys' events, each key's in
	// order (a key's events after one that failed wait for its retry). A
	// claim is split over the free workers as far as its handlers outweigh
	// a transaction's own cost (its begin, the outcomes' writes, its
	// commit; each learnt from the transactions that committed, handlers
	// by event type): slow handlers get a worker each, fast ones share a
	// transaction, which costs the database less and, under load, takes
	// less time. A batch whose
	// handlers are slow commits what ran after a second (a quarter of
	// ClaimTTL if less) and gives the rest back. The events of a batch share its transaction:
	// what a handler sets for the transaction (SET LOCAL, advisory
	// transaction locks) holds for the handlers after it. 1 applies one
	// event per transaction (a worker still claims a run of a key's events
	// at once, and commits each alone). Backends without savepoints
	// (MongoDB; see ferrydriver.InboxBatcher) run one per transaction
	// whatever the setting. At most 64: PostgreSQL keeps the
	// subtransactions of 64 savepoints per transaction in shared memory.
	// Default 32: on PostgreSQL about four times the events/s of 1, with
	// HandleBatch six (docs/benchmarks.md).
	BatchSize int
	// SavepointEach runs every handler of a batch in a savepoint of its
	// own from the start, so that each is called once per attempt,
	// failing or not: for handlers that call other systems and must not
	// be called twice within one attempt (Ferry calls a handler again in a
	// later attempt anyway, after a crash or a lost claim: pass ev.ID as
	// the idempotency key). It costs a subtransaction per event.
	//
	// Without it (the default) a batch first runs with no savepoint.
	// When a handler fails, that transaction is rolled back at once,
	// before anything of it commits, and the batch runs again with a
	// savepoint per handler: the failing event is recorded with the error
	// it gave (its handler is not called again: one call, one attempt,
	// counted even when the second run cannot commit), the handlers before
	// it are called again and commit, those after it run once. A failure
	// that says the transaction was already aborted (PostgreSQL 25P02: an
	// earlier handler ignored its statement's error) is not taken as the
	// handler's own: the second run calls it again. For 10 s after a
	// failure the consumer's batches take savepoints from the start, so
	// that a failing dependency does not make every batch run twice. A
	// batch that nothing fails in costs no subtransaction: on PostgreSQL
	// about a quarter more events/s (docs/benchmarks.md).
	SavepointEach bool
	// ClaimTTL is how long a worker owns an event it runs. A handler must
	// finish within it; past it the event may run elsewhere, and this
	// worker's commit is refused (no double effect). A crashed worker's
	// events run again after it. Default 30 s.
	ClaimTTL time.Duration
	// LivenessTTL is how long this process stays a member of the group
	// without renewing its membership, a lease in the inbox's store
	// renewed every LivenessTTL/3. When a member's lapses (it was
	// SIGKILLed, or lost its database), the group's other processes end
	// its claims at once and run its events again, instead of waiting for
	// ClaimTTL; its late commits are refused, as after any lost claim.
	// Default 5 s; negative: no membership.
	LivenessTTL time.Duration
	// SourceLeaseTTL is the lifetime of the lease that Consume holds on a
	// source that must have one reader at a time (ferrysink.SingleReader:
	// a JetStream durable), renewed every SourceLeaseTTL/3: a standby
	// process takes over within it when the reader dies. Default 5 s.
	SourceLeaseTTL time.Duration
	// RetryBase and RetryMax bound the backoff between attempts of a failed
	// event (exponential, with jitter). Defaults 1 s and 5 min.
	RetryBase, RetryMax time.Duration
	// MaxAttempts is how many times an event runs before it is DEAD.
	// Default 10.
	MaxAttempts int
	// DeadPolicy applies to a key's later events once one is DEAD.
	// Default Hold. Run stores it for the group, and the stored policy is
	// the one every process of the group follows: the last consumer of the
	// group to start sets it.
	DeadPolicy DeadPolicy
	// OnDead is called (outside any transaction) when an event goes DEAD:
	// alert someone. Optional.
	OnDead func(ctx context.Context, d *DeadEvent)
	// PollInterval is the longest an idle worker waits before looking for
	// runnable events (retries that came due, events of other consumer
	// processes). Events ingested by this consumer wake it at once.
	// Default 200 ms.
	PollInterval time.Duration
	// SkipUnhandled marks events of a type without a handler (and no
	// HandleAll) processed, unhandled: counted (outcome "skipped") and
	// logged once per type. By default such an event fails like a handler
	// error that names its type: it retries, goes DEAD, and can be
	// redriven once a handler exists, so that a producer that ships a new
	// type first loses nothing for the group.
	SkipUnhandled bool
	// InboxRetention is how long processed events stay in the inbox, where
	// they make redeliveries harmless. A redelivery of an event older than
	// this (a broker replay, say) would be applied again. Default 7 days;
	// a negative value keeps them forever.
	InboxRetention time.Duration
	// ShutdownTimeout bounds how long Run takes to return once its context
	// is cancelled: a claim in flight may answer, and running handlers
	// (those it claimed too) may finish, until its last quarter (at most
	// 2 s of it) begins; then their contexts are cancelled. Default 10 s.
	ShutdownTimeout time.Duration
	// Logger receives the consumer's logs. Default: slog.Default().
	Logger *slog.Logger
	// Hooks observe the consumer (see Hook): each MetricsHook records its
	// metrics (ferryprom.New(registerer) for Prometheus).
	Hooks []ferryhook.Hook
	// Middleware wraps every handler call, the first outermost (see
	// Middleware): tracing (ferryotel), logging, metrics, code of your own.
	Middleware []Middleware
	// ActivityInterval is how often the consumer records what it did
	// (events applied, failed and gone DEAD, commit → applied latency,
	// handler time) in its inbox (ferrydriver.Admin.RecordActivity), for
	// the console's series. Default
	// 10 s; negative: never.
	ActivityInterval time.Duration
}

// DeadEvent describes an event that will not be retried.
type DeadEvent struct {
	Group    string
	Event    *Event
	Attempts int
	Err      error
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *ConsumerConfig) WithDefaults() ConsumerConfig {
	out := ConsumerConfig{}
	if c != nil {
		out = *c
	}
	if out.Workers == 0 {
		out.Workers = 8
	}
	if out.BatchSize == 0 {
		out.BatchSize = 32
	}
	if out.ClaimTTL == 0 {
		out.ClaimTTL = 30 * time.Second
	}
	if out.LivenessTTL == 0 {
		out.LivenessTTL = 5 * time.Second
	}
	if out.SourceLeaseTTL == 0 {
		out.SourceLeaseTTL = 5 * time.Second
	}
	if out.RetryBase == 0 {
		out.RetryBase = time.Second
	}
	if out.RetryMax == 0 {
		out.RetryMax = 5 * time.Minute
	}
	if out.MaxAttempts == 0 {
		out.MaxAttempts = 10
	}
	if out.PollInterval == 0 {
		out.PollInterval = 200 * time.Millisecond
	}
	if out.InboxRetention == 0 {
		out.InboxRetention = 7 * 24 * time.Hour
	}
	if out.ShutdownTimeout == 0 {
		out.ShutdownTimeout = 10 * time.Second
	}
	if out.ActivityInterval == 0 {
		out.ActivityInterval = defaultActivityInterval
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *ConsumerConfig) validate() error {
	switch {
	case c.Group == "":
		return errors.New("ferry: ConsumerConfig.Group is empty: name the consumer group, e.g. \"billing\"")
	case c.Workers < 1:
		return fmt.Errorf("ferry: ConsumerConfig.Workers is %d: use at least 1 (default 8)", c.Workers)
	case c.BatchSize < 1 || c.BatchSize > maxBatchSize:
		return fmt.Errorf("ferry: ConsumerConfig.BatchSize is %d: use 1 to %d (default 32)", c.BatchSize, maxBatchSize)
	case c.ClaimTTL < time.Second:
		return fmt.Errorf("ferry: ConsumerConfig.ClaimTTL is %v: use at least 1s (default 30s)", c.ClaimTTL)
	case c.LivenessTTL > 0 && c.LivenessTTL < time.Second:
		return fmt.Errorf("ferry: ConsumerConfig.LivenessTTL is %v: use at least 1s, or a negative value for no membership (default 5s)", c.LivenessTTL)
	case c.SourceLeaseTTL < time.Second:
		return fmt.Errorf("ferry: ConsumerConfig.SourceLeaseTTL is %v: use at least 1s (default 5s)", c.SourceLeaseTTL)
	case c.RetryBase <= 0 || c.RetryMax < c.RetryBase:
		return fmt.Errorf("ferry: ConsumerConfig.RetryBase (%v) must be positive and at most RetryMax (%v)", c.RetryBase, c.RetryMax)
	case c.MaxAttempts < 1:
		return fmt.Errorf("ferry: ConsumerConfig.MaxAttempts is %d: use at least 1 (default 10)", c.MaxAttempts)
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("ferry: ConsumerConfig.PollInterval is %v: use at least 1ms (default 200ms)", c.PollInterval)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("ferry: ConsumerConfig.ShutdownTimeout is %v: use a positive duration (default 10s)", c.ShutdownTimeout)
	case c.ActivityInterval > 0 && c.ActivityInterval < 10*time.Millisecond:
		return fmt.Errorf("ferry: ConsumerConfig.ActivityInterval is %v: use at least 10ms, or a negative value for none (default %v)", c.ActivityInterval, defaultActivityInterval)
	case c.DeadPolicy != Hold && c.DeadPolicy != Continue:
		return fmt.Errorf("ferry: ConsumerConfig.DeadPolicy %d is not Hold or Continue", c.DeadPolicy)
	}
	return nil
}

// maxBatchSize bounds BatchSize: PostgreSQL keeps the subtransactions of
// up to 64 savepoints per transaction in shared memory; past that, every
// session's snapshots get slower while the transaction runs.
const maxBatchSize = 64
