package ferry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/google/uuid"
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

// SavepointMode says when the handlers of a batch (ConsumerConfig.
// BatchSize > 1) run inside savepoints of its transaction, which is how a
// failing handler's effects are undone while the others' commit.
type SavepointMode int

const (
	// SavepointsOnFailure runs a batch with no savepoint first. When a
	// handler fails, that transaction is rolled back at once, before
	// anything of it commits, and the batch runs again with a savepoint
	// per handler: the failing event is recorded with the error it gave
	// (its handler is not called again: one call, one attempt, counted
	// even when the second run cannot commit), the handlers before it are
	// called again and commit, those after it run once. A failure that
	// says the transaction was already aborted (PostgreSQL 25P02: an
	// earlier handler ignored its statement's error) is not taken as the
	// handler's own: the second run calls it again. For 10 s after a failure the consumer's batches take
	// savepoints from the start, so that a failing dependency does not
	// make every batch run twice. A batch that nothing fails in costs no
	// subtransaction: on PostgreSQL about a quarter more events/s
	// (docs/benchmarks.md). The default.
	SavepointsOnFailure SavepointMode = iota
	// SavepointsAlways runs every handler of a batch in a savepoint of
	// its own: each handler is called once per attempt, failing or not.
	// For handlers that call other systems and must not be called twice
	// within one attempt (Ferry calls a handler again in a later attempt
	// anyway, after a crash or a lost claim: pass ev.ID as the
	// idempotency key).
	SavepointsAlways
)

func (m SavepointMode) String() string {
	switch m {
	case SavepointsOnFailure:
		return "SavepointsOnFailure"
	case SavepointsAlways:
		return "SavepointsAlways"
	}
	return fmt.Sprintf("SavepointMode(%d)", int(m))
}

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
	// event's failed attempt, and the others commit (see Savepoints for
	// how). A batch holds runs of one or more keys' events, each key's in
	// order (a key's events after one that failed wait for its retry). A
	// claim is split over the free workers, so a light load runs small
	// batches at once and adds no latency; a batch whose handlers are slow
	// commits what ran after a second (a quarter of ClaimTTL if less) and
	// gives the rest back. The events of a batch share its transaction:
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
	// Savepoints says when a batch's handlers run in savepoints of its
	// transaction. Default SavepointsOnFailure.
	Savepoints SavepointMode
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
	// A backend that cannot end claims early (one that does not
	// implement ferrydriver.ClaimReaper; Ferry's four do) waits for
	// ClaimTTL. Default 5 s; negative: no membership.
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
	// handler time) in an inbox that keeps it (ferrydriver.
	// ActivityRecorder), for the console's series. Default
	// DefaultActivityInterval; negative: never.
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
		out.ActivityInterval = DefaultActivityInterval
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
		return fmt.Errorf("ferry: ConsumerConfig.ActivityInterval is %v: use at least 10ms, or a negative value for none (default %v)", c.ActivityInterval, DefaultActivityInterval)
	case c.DeadPolicy != Hold && c.DeadPolicy != Continue:
		return fmt.Errorf("ferry: ConsumerConfig.DeadPolicy %d is not Hold or Continue", c.DeadPolicy)
	case c.Savepoints != SavepointsOnFailure && c.Savepoints != SavepointsAlways:
		return fmt.Errorf("ferry: ConsumerConfig.Savepoints %d is not SavepointsOnFailure or SavepointsAlways", c.Savepoints)
	}
	return nil
}

// maxBatchSize bounds BatchSize: PostgreSQL keeps the subtransactions of
// up to 64 savepoints per transaction in shared memory; past that, every
// session's snapshots get slower while the transaction runs.
const maxBatchSize = 64

// HandlerFunc handles one event inside tx, the consumer database's
// transaction in which the event is also marked processed: the handler's
// writes and that mark commit together, exactly once per (group, event).
// Calls to outside systems should pass ev.ID as their idempotency key.
type HandlerFunc[TTx any] func(ctx context.Context, tx TTx, ev *Event) error

// Consumer runs handlers for the events of its group's inbox: keys in
// parallel, each key in order, with retries and dead letters.
type Consumer[TTx any] struct {
	driver   ferrydriver.Inbox[TTx]
	cfg      ConsumerConfig
	worker   string
	retry    backoff.Policy
	log      *slog.Logger
	handlers map[string]HandlerFunc[TTx]
	// batched holds the handlers registered by HandleBatch; handlers has
	// their one-event form too.
	batched  map[string]BatchHandlerFunc[TTx]
	fallback HandlerFunc[TTx]
	wake     chan struct{}
	m        *consumerMetrics
	ingest   []ferryhook.IngestHook

	// skipped holds the event types skipped unhandled, logged once each.
	skipped sync.Map

	running atomic.Bool
	// batcher is the driver when Run batches events (BatchSize > 1).
	batcher ferrydriver.InboxBatcher[TTx]
	// finisher is the driver when it can record several outcomes in one
	// transaction (an InboxBatcher), whatever BatchSize says: it gives
	// back what a run could not apply in time.
	finisher ferrydriver.InboxBatcher[TTx]
	// batchChosen: the caller set BatchSize (not the default).
	batchChosen bool
	// frozen is set by Run: the handlers are read without a lock from
	// then on, so registering one after Run panics.
	frozen atomic.Bool
	// savepointsUntil (Unix ns): until then batches take savepoints from
	// the start, a handler having failed in one (SavepointsOnFailure).
	savepointsUntil atomic.Int64
	// savepointCooldown is how long (the constant, but in tests).
	savepointCooldown time.Duration
	// rescuing is set while a rescued event runs (alone, holding the
	// worker slots), as one of Run's handlers.
	rescuing atomic.Bool
	// meter counts what the consumer does for the console, while Run runs
	// and the inbox keeps activity (nil otherwise).
	meter *activityMeter
}

// NewConsumer returns a consumer of group cfg.Group over driver.
func NewConsumer[TTx any](driver ferrydriver.Inbox[TTx], cfg *ConsumerConfig) (*Consumer[TTx], error) {
	if driver == nil {
		return nil, errors.New("ferry: NewConsumer needs a driver with an inbox, for example ferrypg.New(pool, nil)")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	m, err := newConsumerMetrics(c.Hooks, c.Group)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	return &Consumer[TTx]{
		batchChosen:       cfg != nil && cfg.BatchSize != 0,
		savepointCooldown: savepointCooldown,
		m:                 m,
		driver:            driver,
		cfg:               c,
		worker:            fmt.Sprintf("%s-%d-%04x", host, os.Getpid(), rand.IntN(1<<16)),
		retry:             backoff.Policy{Base: c.RetryBase, Max: c.RetryMax},
		log:               c.Logger.With("group", c.Group),
		handlers:          map[string]HandlerFunc[TTx]{},
		batched:           map[string]BatchHandlerFunc[TTx]{},
		wake:              make(chan struct{}, 1),
		ingest:            ferryhook.Of[ferryhook.IngestHook](c.Hooks),
	}, nil
}

// Retract marks events RETRACTED in the group's inbox (see
// ferrydriver.InboxRetractor): those not yet run never run, those already
// processed are undone by the retraction handler, once, in key order. It
// returns each event's state before. Chain sources call it on a reorg.
func (c *Consumer[TTx]) Retract(ctx context.Context, events []*Event) ([]ferrydriver.InboxState, error) {
	r, ok := c.driver.(ferrydriver.InboxRetractor)
	if !ok {
		return nil, fmt.Errorf("ferry: the %T inbox cannot retract events; use a backend that implements ferrydriver.InboxRetractor (PostgreSQL, SQLite, MongoDB)", c.driver)
	}
	p := &ferrydriver.RetractInboxParams{Group: c.cfg.Group, Retractions: make([]ferrydriver.Retraction, len(events))}
	for i, ev := range events {
		comp, err := ferryevent.NewRetraction(ev)
		if err != nil {
			return nil, err
		}
		p.Retractions[i] = ferrydriver.Retraction{Event: ev, Compensation: comp}
	}
	res, err := r.RetractInbox(ctx, p)
	if err != nil {
		return nil, err
	}
	c.Notify()
	return res.Prior, nil
}

// Group is the consumer group's name.
func (c *Consumer[TTx]) Group() string { return c.cfg.Group }

// Lookup returns the events of the group's inbox among ids, as received;
// events not in the inbox are absent from the map.
func (c *Consumer[TTx]) Lookup(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]*Event, error) {
	rows, err := c.driver.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: c.cfg.Group, EventIDs: ids})
	if err != nil {
		return nil, err
	}
	out := make(map[uuid.UUID]*Event, len(rows))
	for id, r := range rows {
		out[id] = &r.Event
	}
	return out, nil
}

// Notify wakes idle workers: sources call it after ingesting events.
func (c *Consumer[TTx]) Notify() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Ingest records events in the group's inbox, once per event ID, and wakes
// the workers. Sources call it and acknowledge to their broker only after
// it returned nil: then the events are durable. The transport the events
// came through is the system ctx carries (ferrysink.WithSystem; Consume and
// the webhook receiver set it), or "ferry" (IngestInfo.System).
func (c *Consumer[TTx]) Ingest(ctx context.Context, events []*Event) (inserted int, err error) {
	start := time.Now()
	defer func() {
		system := ferrysink.SystemOf(ctx)
		if system == "" {
			system = DefaultSystem
		}
		c.m.ingested.Add(float64(inserted), system, "inserted")
		if err == nil {
			c.m.ingested.Add(float64(len(events)-inserted), system, "duplicate")
		}
		for _, h := range c.ingest {
			h.OnIngest(&ferryhook.IngestInfo{Group: c.cfg.Group, System: system, Events: events, Inserted: inserted, Start: start, Err: err})
		}
	}()
	res, err := c.driver.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: c.cfg.Group, Events: events})
	if err != nil {
		return 0, err
	}
	for _, ok := range res.Inserted {
		if ok {
			inserted++
		}
	}
	if inserted > 0 {
		c.Notify()
	}
	return inserted, nil
}

// Run records the group's dead policy, then claims and runs events until
// ctx ends or a problem retrying cannot fix: a missing schema
// (ErrSchemaMissing) or a configuration the database refuses
// (ErrMisconfigured), returned. Database outages are retried with backoff,
// and logged.
//
// When ctx ends (or on such a problem), Run stops claiming and lets the
// running handlers finish, within ShutdownTimeout: when its last quarter
// (at most 2 s of it) begins, the handlers' contexts are cancelled (their
// transactions roll back; the events run again later), and a handler
// still running at the end is abandoned (its claim expires, and the event
// runs again). Run returns nil after a stop asked for by ctx.
//
// Handlers are frozen when Run is first called: registering one after
// panics. A Consumer runs once at a time: a second concurrent Run returns
// an error. Run it next to the relay or source that feeds the inbox, for
// example in one errgroup.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("ferry: Consumer.Run called while this consumer is already running: run each Consumer once at a time (one per process and group is enough; Workers sets its parallelism)")
	}
	defer c.running.Store(false)
	c.frozen.Store(true)
	if err := c.storePolicy(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if l, ok := c.driver.(ferrydriver.ConnLimiter); ok {
		if n := l.MaxConns(); n > 0 && n < c.cfg.Workers+2 {
			c.log.Warn("ferry: the database pool is smaller than the consumer needs: handlers will wait for connections, and events of other keys with them; raise the pool's size (pgxpool: pool_max_conns) or lower ConsumerConfig.Workers",
				"pool_max_conns", n, "workers", c.cfg.Workers, "needed", c.cfg.Workers+2)
		}
	}
	c.batcher = nil
	c.finisher, _ = c.driver.(ferrydriver.InboxBatcher[TTx])
	if b, ok := c.driver.(ferrydriver.InboxBatcher[TTx]); ok && c.cfg.BatchSize > 1 {
		c.batcher = b
	} else if c.cfg.BatchSize > 1 && c.batchChosen {
		c.log.Info("ferry: this backend cannot batch events in one transaction (no savepoints); each event runs in a transaction of its own",
			"batch_size", c.cfg.BatchSize)
	}
	// Handlers run under work, which keeps ctx's values but not its end:
	// a stop lets them finish first.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	c.meter = nil
	if rec, ok := c.driver.(ferrydriver.ActivityRecorder); ok && c.cfg.ActivityInterval > 0 {
		// Until the handlers have finished: what they do in the grace
		// period counts too.
		c.meter = newActivityMeter(ferrydriver.ActivityConsumer, c.cfg.Group, c.worker)
		mctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { defer close(done); c.meter.run(mctx, rec, c.cfg.ActivityInterval, c.log) }()
		defer func() { stop(); <-done }()
	}
	// Membership lasts until the handlers have finished: their claims are
	// this process's until then.
	if stop := c.startMembership(ctx); stop != nil {
		defer stop()
	}
	var handlers sync.WaitGroup
	var stoppedAt atomic.Int64 // the stop's time counts against ShutdownTimeout
	defer context.AfterFunc(ctx, func() { stoppedAt.Store(time.Now().UnixNano()) })()
	err := c.run(ctx, work, &handlers)
	since := time.Now()
	if at := stoppedAt.Load(); at != 0 {
		since = time.Unix(0, at)
	}
	c.drain(&handlers, cancelWork, since)
	return err
}

// storePolicy records the group's dead policy (SetInboxPolicy), retrying
// outages until ctx ends.
func (c *Consumer[TTx]) storePolicy(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := c.driver.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: c.cfg.Group, HoldDead: c.cfg.DeadPolicy == Hold})
		switch {
		case err == nil:
			return nil
		case fatal(err):
			return fmt.Errorf("ferry: consumer %s: %w", c.cfg.Group, err)
		case ctx.Err() != nil:
			return ctx.Err()
		}
		c.log.Warn("ferry: storing the group's dead policy failed; retrying", "err", err, "attempt", attempt)
		c.retry.Sleep(ctx.Done(), attempt)
	}
}

// drain waits for the running handlers within ShutdownTimeout counted
// from since (the stop; a claim in flight may have taken some of it): it
// cancels them when its last quarter begins, and abandons them at its end.
func (c *Consumer[TTx]) drain(handlers *sync.WaitGroup, cancel context.CancelFunc, since time.Time) {
	done := make(chan struct{})
	go func() { handlers.Wait(); close(done) }()
	reserve := min(c.cfg.ShutdownTimeout/4, 2*time.Second)
	grace := time.NewTimer(max(0, c.cfg.ShutdownTimeout-reserve-time.Since(since)))
	defer grace.Stop()
	select {
	case <-done:
		return
	case <-grace.C:
	}
	c.log.Warn("ferry: handlers still running at the end of the shutdown grace period: cancelling them (their transactions roll back; the events run again)",
		"shutdown_timeout", c.cfg.ShutdownTimeout)
	cancel()
	end := time.NewTimer(reserve)
	defer end.Stop()
	select {
	case <-done:
	case <-end.C:
		c.log.Error("ferry: a handler ignored its cancelled context; it is abandoned (its claim expires and the event runs again)",
			"shutdown_timeout", c.cfg.ShutdownTimeout)
	}
}

// run claims runnable events while workers are free and runs them under
// work, until ctx ends (nil) or a claim fails for a reason retrying cannot
// fix (returned).
func (c *Consumer[TTx]) run(ctx, work context.Context, handlers *sync.WaitGroup) error {
	slots := make(chan struct{}, c.cfg.Workers)
	var upkeep sync.WaitGroup
	defer upkeep.Wait()
	upkeep.Go(func() { c.maintain(ctx) })
	errAttempt := 0
	runLength := 1.0 // events per key in the last claim
	var rescueChecked time.Time
	for ctx.Err() == nil {
		// Rescued events run alone: nothing is claimed until they are
		// done (they wake the loop then), not even when the rescue could
		// not wait for every running handler.
		if c.rescuing.Load() {
			t := time.NewTimer(c.cfg.PollInterval)
			select {
			case <-ctx.Done():
			case <-c.wake:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		if time.Since(rescueChecked) >= rescueInterval(c.cfg.ClaimTTL) {
			rescueChecked = time.Now()
			if c.rescue(ctx, work, slots, handlers) {
				rescueChecked = time.Time{} // there may be more
				continue
			}
		}
		free := c.cfg.Workers - len(slots)
		// One event per transaction: each free worker gets a run of one
		// key's events, which it applies in order, a transaction each.
		limit, perKey, keys := free*maxRun, maxRun, free
		if c.batcher != nil {
			// Runs of a key's events, up to a batch each; as many keys as
			// the last claim's runs suggest fill the batches (a deep
			// backlog gives long runs: few keys need locking).
			limit, perKey = free*c.cfg.BatchSize, c.cfg.BatchSize
			if len(c.batched) > 0 {
				// A batch handler gets a round's events (one per key) in
				// one call: short runs of many keys make few calls.
				perKey = batchHandlerRun(c.cfg.BatchSize)
			}
			keys = max(free, int(float64(limit)/max(runLength, 1)))
		}
		var rows []*ferrydriver.InboxRow
		var err error
		// A handler must commit before its claim expires: its deadline is
		// counted from before the claim, less a margin.
		deadline := time.Now().Add(c.cfg.ClaimTTL - c.cfg.ClaimTTL/10)
		if free > 0 {
			rows, err = c.claim(ctx, &ferrydriver.ClaimInboxParams{Limit: limit, PerKey: perKey, Keys: keys})
		}
		if err != nil && len(rows) > 0 {
			// The rows were claimed (a step after the claim failed, such as
			// telling settlement waiters of rows it made DEAD): run them,
			// or nobody would until their claims expired.
			c.log.Warn("ferry: claiming events partly failed; running the events it claimed", "err", err, "events", len(rows))
			err = nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if fatal(err) {
				c.log.Error("ferry: the consumer cannot claim events, and retrying cannot fix it; stopping", "err", err)
				return fmt.Errorf("ferry: consumer %s: %w", c.cfg.Group, err)
			}
			errAttempt++
			c.log.Warn("ferry: claiming events failed; retrying", "err", err, "attempt", errAttempt)
			c.retry.Sleep(ctx.Done(), errAttempt)
			continue
		}
		errAttempt = 0
		runnable := rows[:0:0]
		for _, row := range rows {
			if row.State == ferrydriver.InboxDead {
				// Given up at claim time: its last attempts lost their claims.
				c.reportDead(work, row, errors.New(row.LastError))
				continue
			}
			runnable = append(runnable, row)
		}
		if k := distinctKeys(runnable); k > 0 {
			runLength = float64(len(runnable)) / float64(k)
		}
		units := runsOf(runnable) // one event per transaction: a worker per key's run
		if c.batcher != nil {
			units = batches(runnable, free, c.cfg.BatchSize)
		}
		for _, batch := range units {
			slots <- struct{}{}
			handlers.Go(func() {
				defer func() { <-slots; c.Notify() }()
				if c.batcher != nil && len(batch) > 1 {
					c.processBatch(work, c.batcher, batch, deadline)
				} else {
					c.processRun(work, batch, deadline)
				}
			})
		}
		if len(rows) == limit && free > 0 {
			continue // there may be more
		}
		t := time.NewTimer(c.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-c.wake:
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// claim runs ClaimInbox so that a stop does not drop what it claims. A
// claim already sent commits in the database whether or not its answer is
// read (PostgreSQL runs a statement it has received although the client
// gave up, and a cancel request it gets before reading it is ignored), so a
// claim cancelled by ctx's end would leave its events PROCESSING, run by
// nobody, until their claims expired (ClaimTTL). Once ctx ends the claim gets claimGrace more to
// answer; what it returns runs like any claim, within the shutdown's
// grace period.
func (c *Consumer[TTx]) claim(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.claimGrace(), cancel)
		context.AfterFunc(cctx, func() { t.Stop() })
	})
	defer stop()
	p.Group, p.Worker, p.TTL, p.MaxAttempts = c.cfg.Group, c.worker, c.cfg.ClaimTTL, c.cfg.MaxAttempts
	return c.driver.ClaimInbox(cctx, p)
}

// distinctKeys counts the keys of claimed rows (grouped by key).
func distinctKeys(rows []*ferrydriver.InboxRow) int {
	n := 0
	for i, row := range rows {
		if i == 0 || row.Event.Key != rows[i-1].Event.Key {
			n++
		}
	}
	return n
}

// gaugeLeaser is the part of a driver's leases the gauges use: one
// process per group refreshes them.
type gaugeLeaser interface {
	AcquireLease(ctx context.Context, p *ferrydriver.AcquireLeaseParams) (*ferrydriver.Lease, error)
}

// maintain refreshes the inbox gauges every 15 s, in one process of the
// group when the driver has leases (the others drop the series), and
// removes processed inbox rows older than InboxRetention every minute.
func (c *Consumer[TTx]) maintain(ctx context.Context) {
	const every = 15 * time.Second
	t := time.NewTicker(every)
	defer t.Stop()
	var lastRetention time.Time
	failing := false
	for {
		err := c.refreshGauges(ctx, every)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			failing = true
			c.log.Warn("ferry: refreshing the inbox gauges failed; retrying every 15 s (logged once until it works)", "err", err)
		case err == nil && failing:
			failing = false
			c.log.Info("ferry: the inbox gauges are refreshed again")
		}
		if c.cfg.InboxRetention >= 0 && time.Since(lastRetention) >= time.Minute {
			lastRetention = time.Now()
			c.retain(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshGauges sets the inbox gauges, capped counts, if this process
// holds the group's gauge lease (or the driver has no leases).
func (c *Consumer[TTx]) refreshGauges(ctx context.Context, every time.Duration) error {
	if l, ok := c.driver.(gaugeLeaser); ok {
		lease, err := l.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: "consumer-gauges/" + c.cfg.Group, Holder: c.worker, TTL: 3 * every})
		if err != nil {
			return fmt.Errorf("take the gauge lease: %w", err)
		}
		if !lease.Held(c.worker) {
			c.m.inbox.Reset() // another process of the group reports them
			return nil
		}
	}
	counts, err := c.driver.InboxCounts(ctx, c.cfg.Group)
	if err != nil {
		return err
	}
	for _, s := range []ferrydriver.InboxState{ferrydriver.InboxPending, ferrydriver.InboxProcessing, ferrydriver.InboxFailed, ferrydriver.InboxDead} {
		c.m.inbox.WithLabelValues(string(s)).Set(float64(counts[s]))
	}
	return nil
}

// retain removes processed inbox rows older than InboxRetention.
func (c *Consumer[TTx]) retain(ctx context.Context) {
	const chunk = ferrydriver.RetentionChunk
	for ctx.Err() == nil {
		n, err := c.driver.DeleteProcessedInbox(ctx, &ferrydriver.DeleteProcessedInboxParams{Group: c.cfg.Group, OlderThan: c.cfg.InboxRetention, Limit: chunk})
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("ferry: inbox retention failed; will retry", "err", err)
			}
			return
		}
		if n < chunk {
			return
		}
	}
}

// handlerFor returns the handler of ev's type: the fallback (HandleAll)
// without one of its own, nil for a retraction nobody handles (logged) or
// a type skipped unhandled (SkipUnhandled: unhandled is true), and one
// that fails naming the type otherwise.
func (c *Consumer[TTx]) handlerFor(ev *Event) (handler HandlerFunc[TTx], unhandled bool) {
	handler = c.handlers[ev.Type]
	if handler == nil && ev.Type != ferryevent.TypeRetraction {
		handler = c.fallback
	}
	switch {
	case handler != nil:
	case ev.Type == ferryevent.TypeRetraction:
		c.log.Warn("ferry: an event this group processed was retracted, and the group has no retraction handler (HandleRetraction): nothing undoes its effect",
			"event_id", ev.ID, "key", ev.Key)
	case c.cfg.SkipUnhandled:
		unhandled = true
		if _, seen := c.skipped.LoadOrStore(ev.Type, true); !seen {
			c.log.Warn("ferry: skipping events of a type this group has no handler for (SkipUnhandled); logged once per type",
				"type", ev.Type, "event_id", ev.ID)
		}
	default:
		handler = func(context.Context, TTx, *Event) error {
			return fmt.Errorf("no handler for event type %q in group %s: register one (Handle, HandleEvent or HandleAll) and redrive, or set ConsumerConfig.SkipUnhandled to skip such events", ev.Type, c.cfg.Group)
		}
	}
	return handler, unhandled
}

// callHandler runs handler (nil: nothing to run) for ev, inside the
// middleware (see call).
func (c *Consumer[TTx]) callHandler(ctx context.Context, tx TTx, handler HandlerFunc[TTx], ev *Event) error {
	if handler == nil {
		return nil
	}
	return c.call(withEvent(ctx, ev), []*Event{ev}, func(ctx context.Context) error { return handler(ctx, tx, ev) })
}

// call runs one handler call for evs: with the group in ctx, inside the
// middleware, a panic turned into an error with its stack.
func (c *Consumer[TTx]) call(ctx context.Context, evs []*Event, run func(ctx context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return chain(c.cfg.Middleware, evs, run)(context.WithValue(ctx, groupKey{}, c.cfg.Group))
}

// batchHandlerRun is how many events of one key a batch takes when the
// consumer has batch handlers (HandleBatch), which get one call per round
// of a batch (one event of each key): a round trip per round, against two
// writes of a key's row per key, balanced.
func batchHandlerRun(batchSize int) int {
	return max(1, batchSize/8)
}

// maxRun bounds the events of one key that a worker claims at once to
// apply one per transaction (ConsumerConfig.BatchSize 1): a run costs
// one claim.
const maxRun = 32

// processRun applies claimed events one per transaction, in order: a run
// of one key's events claimed together (or one event). The claim stays on
// the run's later events while the earlier ones commit; when one does not
// finish (it failed, its claim was lost) the driver releases the rest,
// which run again, uncounted, and so does a run that outlives its time
// budget (see batchBudget).
func (c *Consumer[TTx]) processRun(ctx context.Context, rows []*ferrydriver.InboxRow, deadline time.Time) {
	start := time.Now()
	for i, row := range rows {
		if i > 0 && time.Since(start) > batchBudget(c.cfg.ClaimTTL) {
			if c.finisher != nil {
				c.giveBack(ctx, c.finisher, rows[i:], "its run ran out of time before its turn", nil, start)
				return
			}
			for _, row := range rows[i:] {
				_ = c.failInbox(ctx, &ferrydriver.FailInboxParams{Group: c.cfg.Group, EventID: row.Event.ID, Claim: row.Claim,
					Error: "given back: its run ran out of time before its turn", RetryAt: time.Now(), Uncounted: true})
			}
			return
		}
		if !c.process(ctx, row, deadline, i < len(rows)-1) {
			return
		}
	}
}

// process runs one claimed event and records the outcome; keep keeps the
// claim on the later events of its run. It reports whether the event
// finished (processed, or skipped unhandled).
func (c *Consumer[TTx]) process(ctx context.Context, row *ferrydriver.InboxRow, deadline time.Time, keep bool) bool {
	ev := &row.Event
	handler, unhandled := c.handlerFor(ev)
	hctx, cancel := context.WithDeadline(ctx, deadline) // ctx: the work context, cancelled only by a stop past its grace
	defer cancel()
	start := time.Now()
	defer func() { c.m.handlerSeconds.Observe(time.Since(start).Seconds()) }()
	err := c.driver.RunInTx(hctx, func(ctx context.Context, tx TTx) error {
		if err := c.callHandler(ctx, tx, handler, ev); err != nil {
			return err
		}
		return c.driver.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{
			Group: c.cfg.Group, EventID: ev.ID, Claim: row.Claim, Keep: keep})
	})
	if err == nil {
		now := time.Now()
		c.meter.did(now, now.Sub(start), ev.CreatedAt)
		if unhandled {
			c.m.outcomes.WithLabelValues("skipped").Inc()
		} else {
			c.m.outcomes.WithLabelValues("processed").Inc()
		}
		return true
	}
	if errors.Is(err, ferrydriver.ErrClaimLost) {
		c.m.outcomes.WithLabelValues("claim_lost").Inc()
		c.log.WarnContext(withEvent(ctx, ev), "ferry: an event's handler outlived its claim: its effect was rolled back; the event runs again, or already did in a later attempt",
			"event_id", ev.ID, "key", ev.Key, "attempt", row.Attempts, "claim_ttl", c.cfg.ClaimTTL, "elapsed", time.Since(start).Round(time.Millisecond))
		return false
	}
	if errors.Is(err, ferrydriver.ErrTxNotBegun) {
		c.notBegun(ctx, row, err)
		return false
	}
	c.fail(ctx, row, err, start)
	return false
}

// fail records a failed attempt of row (started at start): FAILED with a
// retry time, or DEAD.
func (c *Consumer[TTx]) fail(ctx context.Context, row *ferrydriver.InboxRow, err error, start time.Time) {
	ev := &row.Event
	dead, retryAt := c.decide(row, err)
	ferr := c.failInbox(ctx, &ferrydriver.FailInboxParams{
		Group: c.cfg.Group, EventID: ev.ID, Claim: row.Claim, Error: err.Error(), RetryAt: retryAt, Dead: dead,
	})
	if errors.Is(ferr, ferrydriver.ErrClaimLost) {
		c.m.outcomes.WithLabelValues("claim_lost").Inc()
		c.log.WarnContext(withEvent(ctx, ev), "ferry: an event's handler failed after its claim had expired: the failure is not recorded; the event runs again, or already did in a later attempt",
			"event_id", ev.ID, "key", ev.Key, "attempt", row.Attempts, "claim_ttl", c.cfg.ClaimTTL, "elapsed", time.Since(start).Round(time.Millisecond), "err", err)
		return
	}
	if ferr != nil {
		// The claim expires and the event runs again: nothing is lost.
		c.log.WarnContext(withEvent(ctx, ev), "ferry: recording a failed attempt failed", "event_id", ev.ID, "err", ferr)
		return
	}
	if dead {
		c.meter.fail(1, 0)
		c.reportDead(ctx, row, err)
		return
	}
	c.meter.fail(1, 0)
	c.m.outcomes.WithLabelValues("retried").Inc()
	c.log.InfoContext(withEvent(ctx, ev), "ferry: handler failed; will retry", "event_id", ev.ID, "attempt", row.Attempts, "retry_at", retryAt, "err", err)
}

// failInbox records a failed attempt, even once ctx is done, within a
// ClaimTTL: a connection that went dark must not hold the worker (the claim
// expires and the event runs again anyway).
func (c *Consumer[TTx]) failInbox(ctx context.Context, p *ferrydriver.FailInboxParams) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ClaimTTL)
	defer cancel()
	return c.driver.FailInbox(fctx, p)
}

// notBegun gives back the claim of an event whose transaction could not
// begin (the handler never ran): it runs again shortly, and the attempt
// does not count.
func (c *Consumer[TTx]) notBegun(ctx context.Context, row *ferrydriver.InboxRow, err error) {
	ev := &row.Event
	ferr := c.failInbox(ctx, &ferrydriver.FailInboxParams{
		Group: c.cfg.Group, EventID: ev.ID, Claim: row.Claim, Error: err.Error(), RetryAt: time.Now().Add(c.retry.Delay(1) / 4),
		Uncounted: true})
	c.m.outcomes.WithLabelValues("not_begun").Inc()
	c.log.WarnContext(withEvent(ctx, ev), "ferry: could not begin a handler's transaction (is the connection pool smaller than Workers?); the handler did not run, and the attempt does not count",
		"event_id", ev.ID, "key", ev.Key, "workers", c.cfg.Workers, "err", err, "release_err", ferr)
}

// reportDead counts, logs and hands to OnDead an event that went DEAD.
func (c *Consumer[TTx]) reportDead(ctx context.Context, row *ferrydriver.InboxRow, err error) {
	ev := &row.Event
	c.meter.fail(0, 1)
	c.m.outcomes.WithLabelValues("dead").Inc()
	c.log.ErrorContext(withEvent(ctx, ev), "ferry: event is dead", "event_id", ev.ID, "key", ev.Key, "type", ev.Type, "attempts", row.Attempts, "err", err)
	if c.cfg.OnDead != nil {
		c.cfg.OnDead(ctx, &DeadEvent{Group: c.cfg.Group, Event: ev, Attempts: row.Attempts, Err: err})
	}
}

// decide turns a handler error into DEAD or a retry time.
func (c *Consumer[TTx]) decide(row *ferrydriver.InboxRow, err error) (dead bool, retryAt time.Time) {
	var gu *giveUpError
	if errors.As(err, &gu) || row.Attempts >= c.cfg.MaxAttempts {
		return true, time.Time{}
	}
	var ra *retryAfterError
	if errors.As(err, &ra) {
		return false, time.Now().Add(ra.after)
	}
	return false, time.Now().Add(c.retry.Delay(row.Attempts))
}

type retryAfterError struct {
	after time.Duration
	err   error
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("retry after %v: %v", e.after, e.err)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter makes a handler's failure retry after d instead of the
// backoff (a rate limit's Retry-After, a dependency's maintenance window).
// MaxAttempts still applies.
func RetryAfter(d time.Duration, err error) error { return &retryAfterError{after: d, err: err} }

type giveUpError struct{ err error }

func (e *giveUpError) Error() string { return "giving up: " + e.err.Error() }
func (e *giveUpError) Unwrap() error { return e.err }

// GiveUp makes a handler's failure final: the event goes DEAD at once
// (invalid input that no retry can fix).
func GiveUp(err error) error { return &giveUpError{err: err} }
