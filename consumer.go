package ferry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
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
	// claimer is the driver when its ingestion can claim what it inserts
	// (ferrydriver.InboxIngestClaimer); live is what Run lends Ingest to
	// run those events on.
	claimer ferrydriver.InboxIngestClaimer
	live    liveRun
	m       *consumerMetrics
	ingest  []ferryhook.IngestHook

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
	// the start, a handler having failed in one (without SavepointEach).
	savepointsUntil atomic.Int64
	// savepointCooldown is how long (the constant, but in tests).
	savepointCooldown time.Duration
	// rescuing is set while a rescue gathers the worker slots and while
	// rescued events run (alone, holding them), as Run's handlers.
	rescuing atomic.Bool
	// meter counts what the consumer does for the console, while Run runs
	// and the inbox keeps activity (nil otherwise).
	meter *activityMeter
	// costs is what its transactions cost, for cutting claims into
	// batches (BatchSize > 1).
	costs txCosts
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
	claimer, _ := driver.(ferrydriver.InboxIngestClaimer)
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
		claimer:           claimer,
		ingest:            ferryhook.Of[ferryhook.IngestHook](c.Hooks),
	}, nil
}

// Retract marks events RETRACTED in the group's inbox (see
// ferrydriver.Inbox.RetractInbox): those not yet run never run, those already
// processed are undone by the retraction handler, once, in key order. It
// returns each event's state before. Chain sources call it on a reorg.
func (c *Consumer[TTx]) Retract(ctx context.Context, events []*Event) ([]ferrydriver.InboxState, error) {
	p := &ferrydriver.RetractInboxParams{Group: c.cfg.Group, Retractions: make([]ferrydriver.Retraction, len(events))}
	for i, ev := range events {
		comp, err := ferryevent.NewRetraction(ev)
		if err != nil {
			return nil, err
		}
		p.Retractions[i] = ferrydriver.Retraction{Event: ev, Compensation: comp}
	}
	res, err := c.driver.RetractInbox(ctx, p)
	if err != nil {
		return nil, err
	}
	c.Notify()
	return res, nil
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
// the workers. While Run runs, on an inbox that can (a
// ferrydriver.InboxIngestClaimer: every backend's),
// what records the events also claims those of keys with nothing else to
// do, and Ingest starts them on the workers itself. Sources call it and
// acknowledge to their broker only after it returned nil: then the events
// are durable. The transport the events came through is the system ctx
// carries (ferrysink.WithSystem; Consume and the webhook receiver set it),
// or "ferry" (IngestInfo.System).
func (c *Consumer[TTx]) Ingest(ctx context.Context, events []*Event) (inserted int, err error) {
	start := time.Now()
	defer func() {
		system := ferrysink.SystemOf(ctx)
		if system == "" {
			system = ferryhook.DefaultSystem
		}
		c.m.ingested.Add(float64(inserted), system, "inserted")
		if err == nil {
			c.m.ingested.Add(float64(len(events)-inserted), system, "duplicate")
		}
		for _, h := range c.ingest {
			h.OnIngest(&ferryhook.IngestInfo{Group: c.cfg.Group, System: system, Events: events, Inserted: inserted, Start: start, Err: err})
		}
	}()
	res, claimed, err := c.insert(ctx, events)
	if err != nil {
		return 0, err
	}
	for _, ok := range res {
		if ok {
			inserted++
		}
	}
	if inserted > claimed {
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
	if n := c.driver.MaxConns(); n > 0 && n < c.cfg.Workers+2 {
		c.log.Warn("ferry: the database pool is smaller than the consumer needs: handlers will wait for connections, and events of other keys with them; raise the pool's size (pgxpool: pool_max_conns) or lower ConsumerConfig.Workers",
			"pool_max_conns", n, "workers", c.cfg.Workers, "needed", c.cfg.Workers+2)
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
	if c.cfg.ActivityInterval > 0 {
		// Until the handlers have finished: what they do in the grace
		// period counts too.
		c.meter = newActivityMeter(ferrydriver.ActivityConsumer, c.cfg.Group, c.worker)
		mctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { defer close(done); c.meter.run(mctx, c.driver, c.cfg.ActivityInterval, c.log) }()
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
	c.live.lend(work, slots, handlers)
	defer c.live.end()
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
		free, perKey := c.freeWorkers(slots), c.runLength()
		// One event per transaction: each free worker gets a run of one
		// key's events, which it applies in order, a transaction each.
		limit, keys := free*maxRun, free
		if c.batcher != nil {
			// Runs of a key's events, up to a batch each; as many keys as
			// the last claim's runs suggest fill the batches (a deep
			// backlog gives long runs: few keys need locking).
			limit = free * c.cfg.BatchSize
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
			units = batches(runnable, c.costs.spread(runnable, free), c.cfg.BatchSize)
		}
		c.start(work, units, slots, handlers, deadline)
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

// claim runs ClaimInbox so that a stop does not drop what it claims
// (claimContext).
func (c *Consumer[TTx]) claim(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	cctx, cancel := c.claimContext(ctx)
	defer cancel()
	p.Group, p.Worker, p.TTL, p.MaxAttempts = c.cfg.Group, c.worker, c.cfg.ClaimTTL, c.cfg.MaxAttempts
	return c.driver.ClaimInbox(cctx, p)
}

// claimContext is the context of a statement that claims rows (a claim,
// an ingest that claims): ctx's end reaches it claimGrace later. A
// statement already sent commits in the database whether or not its
// answer is read (PostgreSQL runs a statement it has received although
// the client gave up, and a cancel request it gets before reading it is
// ignored), and only its caller knows what it claimed: cancelled by ctx's
// end, it would leave its rows claimed and run by nobody until their
// claims expired (ClaimTTL). What it returns runs like any claim, within
// the shutdown's grace period.
func (c *Consumer[TTx]) claimContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.claimGrace(), cancel)
		context.AfterFunc(cctx, func() { t.Stop() })
	})
	return cctx, func() { stop(); cancel() }
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
	AcquireLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error)
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
		lease, err := l.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "consumer-gauges/" + c.cfg.Group, Holder: c.worker, TTL: 3 * every})
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
