package ferry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
	"github.com/ferry-dev/ferry/ferrysink"
)

func (r *Relay) alert(ctx context.Context, k *StuckKey) {
	if r.cfg.OnStuckKey != nil {
		r.cfg.OnStuckKey(ctx, k)
	}
}

// reportDuplicates counts what the destination dropped as duplicates
// since the last call, and logs them at most once a HeartbeatInterval
// (and, with flush, what is not logged yet): a feed that replays what
// another published meets a duplicate per event, and a line each told
// nothing more than their count. Called by the pipeline's goroutine.
func (r *Relay) reportDuplicates(flush bool) {
	if r.dups == nil {
		return
	}
	if n := r.dups.Duplicates(); n > r.lastDup {
		r.m.duplicates.Add(float64(n - r.lastDup))
		r.unloggedDups += n - r.lastDup
		r.lastDup = n
	}
	if r.unloggedDups > 0 && (flush || time.Since(r.dupsLoggedAt) >= r.cfg.HeartbeatInterval) {
		r.log.Info("ferry: destination dropped duplicates (events it already had, by ID)", "count", r.unloggedDups)
		r.unloggedDups, r.dupsLoggedAt = 0, time.Now()
	}
}

// Relay tails one outbox partition and publishes it to a sink: in commit
// order per key, at least once, with the checkpoint saved only after the
// sink acknowledged (or the event was dead-lettered). One relay per feed is
// active at a time, by a lease fenced with a term; others wait as standbys.
type Relay struct {
	store ferrydriver.Store
	sink  ferrysink.Sink
	cfg   RelayConfig
	name  string
	// meter counts what the relay does for the console, while Run runs
	// and the store keeps activity (nil otherwise).
	meter   *activityMeter
	log     *slog.Logger
	m       *relayMetrics
	ordered bool
	retry   backoff.Policy
	dups    ferrysink.DuplicateReporter // nil if the sink cannot tell
	lastDup uint64
	// unloggedDups counts the duplicates not logged yet, since
	// dupsLoggedAt (reportDuplicates).
	unloggedDups uint64
	dupsLoggedAt time.Time
	hooks        []ferryhook.PublishHook
	system       string // the sink's ferrysink.Describer, if any

	running atomic.Bool
	// holder is this Run's lease identity and log its logger; both are set
	// at the start of Run, which runs once at a time.
	holder string
	// progress counts delivered non-empty batches and saved heartbeats: a
	// leadership that moved it was healthy, so the backoff starts afresh.
	progress atomic.Int64
	// parkedLoadCap bounds the parked keys a leadership loads at once (0:
	// defaultParkedLoadCap); tests lower it (export_test.go).
	parkedLoadCap int
	// health is what Health reports (relay_health.go).
	health relayHealth
}

// NewRelay returns a relay from store to sink.
func NewRelay(store ferrydriver.Store, sink ferrysink.Sink, cfg *RelayConfig) (*Relay, error) {
	if store == nil || sink == nil {
		return nil, errors.New("ferry: NewRelay needs a store (for example ferrypg.New(pool, nil)) and a sink (for example ferrynats.New)")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	name := c.Feed + "/" + strconv.Itoa(c.Partition)
	m, err := newRelayMetrics(c.Hooks, name)
	if err != nil {
		return nil, err
	}
	ob, _ := sink.(ferrysink.OrderedBatcher)
	return &Relay{
		store: store, sink: sink, cfg: c, name: name, m: m,
		log:     c.Logger.With("feed", name),
		ordered: ob != nil && ob.OrderedBatches(),
		retry:   backoff.Policy{Base: c.RetryBase, Max: c.RetryMax},
		dups:    dupReporter(sink),
		hooks:   ferryhook.Of[ferryhook.PublishHook](c.Hooks),
		system:  sinkSystem(sink),
	}, nil
}

func sinkSystem(s ferrysink.Sink) string {
	if d, ok := s.(ferrysink.Describer); ok {
		return d.System()
	}
	return ""
}

func dupReporter(s ferrysink.Sink) ferrysink.DuplicateReporter {
	d, _ := s.(ferrysink.DuplicateReporter)
	return d
}

// FeedName returns "<Feed>/<Partition>", the name of the relay's checkpoint
// and lease.
func (r *Relay) FeedName() string { return r.name }

// Run relays until ctx is cancelled, then finishes the batch in flight,
// saves the checkpoint, releases the lease and returns nil, all within
// ShutdownTimeout. It returns an error for a problem retrying cannot fix (a
// missing schema, ErrSchemaMissing; a partition or partition count the
// schema does not have, ErrMisconfigured); database and broker outages are
// retried with backoff, which grows across leaderships until one of them
// makes progress. A Relay runs once at a time: a second concurrent Run
// returns an error.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("ferry: Relay.Run called while this relay is already running: run each Relay once at a time (create one per partition)")
	}
	defer r.running.Store(false)
	r.health.started(time.Now())
	r.holder = fmt.Sprintf("%s#%08x", r.cfg.HolderID, rand.Uint32())
	r.log = r.cfg.Logger.With("feed", r.name, "holder", r.holder)
	r.meter = nil
	if r.cfg.ActivityInterval > 0 {
		r.meter = newActivityMeter(ferrydriver.ActivityRelay, r.name, r.holder)
		mctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { defer close(done); r.meter.run(mctx, r.store, r.cfg.ActivityInterval, r.log) }()
		defer func() { stop(); <-done }()
	}
	attempt := 0
	bal := r.cfg.Balancer
	standby := func() {
		r.m.leader.Set(0)
		// Try again well within the TTL, with jitter.
		sleepCtx(ctx, r.cfg.LeaseTTL/4+time.Duration(rand.Int64N(int64(r.cfg.LeaseTTL/8))))
	}
	for ctx.Err() == nil {
		if bal != nil && !bal.reserve(ctx, r.cfg.Partition) {
			standby() // this process leads its share already
			continue
		}
		asked := time.Now()
		lease, err := r.store.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: r.name, Holder: r.holder, TTL: r.cfg.LeaseTTL})
		if bal != nil && (err != nil || !lease.Held(r.holder)) {
			bal.release(r.cfg.Partition)
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if fatal(err) {
				return err
			}
			attempt++
			r.log.Warn("ferry: relay cannot reach its store; retrying", "err", err, "attempt", attempt)
			r.retry.Sleep(ctx.Done(), attempt)
			continue
		}
		if !lease.Held(r.holder) {
			standby()
			continue
		}
		r.log.Info("ferry: relay is the leader", "term", lease.Term)
		before := r.progress.Load()
		leadCtx, endLead := context.WithCancel(ctx)
		if bal != nil {
			// Handing the partition over is a graceful stop of this
			// leadership: checkpoint saved, lease released.
			yield := bal.yielding(r.cfg.Partition)
			go func() {
				select {
				case <-yield:
					r.log.Info("ferry: handing the partition over to another member of the relay group", "term", lease.Term)
					endLead()
				case <-leadCtx.Done():
				}
			}()
		}
		err = r.lead(leadCtx, lease, asked)
		endLead()
		if bal != nil {
			bal.release(r.cfg.Partition)
		}
		r.m.leader.Set(0)
		if r.progress.Load() != before {
			attempt = 0
		}
		switch {
		case err == nil || ctx.Err() != nil:
		case fatal(err):
			r.log.Error("ferry: relay stopped: this cannot be fixed by retrying", "err", err)
			return err
		case errors.Is(err, ferrydriver.ErrLeaseLost):
			r.log.Warn("ferry: relay lost its lease; standing by", "term", lease.Term, "err", err)
		default:
			attempt++
			r.log.Error("ferry: relay stopped leading after an error; retrying", "err", err, "attempt", attempt)
			r.retry.Sleep(ctx.Done(), attempt)
		}
	}
	return nil
}

// fatal reports whether err is one that retrying cannot fix.
func fatal(err error) bool {
	return errors.Is(err, ferrydriver.ErrSchemaMissing) || errors.Is(err, ferrydriver.ErrMisconfigured)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// errTrustExpired is the cause when the leader could not renew in time.
var errTrustExpired = fmt.Errorf("lease not renewed within its TTL: %w", ferrydriver.ErrLeaseLost)

var (
	errStopping        = errors.New("relay stopping")
	errShutdownTimeout = errors.New("relay stopping: ShutdownTimeout reached with the publish in flight")
)

// shutdown measures a stopping relay's ShutdownTimeout from the moment the
// stop was first seen.
type shutdown struct {
	// reserve is the end of the timeout kept for the final checkpoint and
	// the lease release.
	reserve time.Duration
	once    sync.Once
	at      time.Time
}

func newShutdown(timeout time.Duration) *shutdown {
	return &shutdown{reserve: min(timeout/4, 2*time.Second)}
}

// begin returns when the stop was first seen, recording now if not yet.
func (s *shutdown) begin() time.Time {
	s.once.Do(func() { s.at = time.Now() })
	return s.at
}

type readResult struct {
	batch *ferrydriver.Batch
	// n numbers the batch among those whose Seqs the relay gave; seqs is
	// the last Seq it gave each key in the batch.
	n    uint64
	seqs map[string]int64
	err  error
}

// readAhead reads batches in order into out until ctx ends or a read fails
// (the failure is sent as the last result), numbering their events
// (keySeqs) and, between two reads, forgetting idle keys.
func (r *Relay) readAhead(ctx context.Context, feed ferrydriver.Feed, seqs *keySeqs, out chan<- readResult) {
	for {
		res := readResult{}
		res.batch, res.err = feed.Read(ctx, &ferrydriver.ReadParams{Max: r.cfg.BatchSize, Wait: r.cfg.PollInterval})
		if res.err == nil {
			res.n, res.seqs, res.err = seqs.number(ctx, res.batch)
			if res.err != nil {
				res.batch = nil
			}
		}
		err := res.err
		if err != nil && ctx.Err() != nil {
			return
		}
		select {
		case out <- res:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
		seqs.prune(ctx) // while the pipeline publishes the batch
	}
}

// keepLease renews the lease every TTL/3 and cancels leaseCtx when it is
// lost or when the local trust window ends. The window is the lease's
// remaining time as the database granted it, minus a margin, counted on the
// local monotonic clock from before the request that obtained it.
func (r *Relay) keepLease(ctx context.Context, lease *ferrydriver.Lease, lose context.CancelCauseFunc, asked time.Time, trusted *trustWindow) {
	ttl := r.cfg.LeaseTTL
	margin := leaseMargin(ttl)
	trustUntil := asked.Add(lease.ExpiresAt.Sub(lease.Now) - margin)
	trusted.set(trustUntil)
	tick := time.NewTicker(ttl / 3)
	defer tick.Stop()
	for {
		trust := time.NewTimer(time.Until(trustUntil))
		select {
		case <-ctx.Done():
			trust.Stop()
			return
		case <-trust.C:
			lose(errTrustExpired)
			return
		case <-tick.C:
			trust.Stop()
			start := time.Now()
			rctx, cancel := context.WithDeadline(ctx, trustUntil)
			l, err := r.store.RenewLease(rctx, &ferrydriver.LeaseParams{Name: r.name, Holder: r.holder, Term: lease.Term, TTL: ttl})
			cancel()
			switch {
			case err == nil:
				trustUntil = start.Add(l.ExpiresAt.Sub(l.Now) - margin)
				trusted.set(trustUntil)
			case errors.Is(err, ferrydriver.ErrLeaseLost):
				lose(err)
				return
			default:
				r.log.Warn("ferry: lease renewal failed; will retry until the lease's trust window ends", "err", err, "trust_left", time.Until(trustUntil).Round(time.Millisecond))
			}
		}
	}
}

// trustWindow is the end of a leader's local trust in its lease, read by
// the sink calls before every hand-off. The time keeps its monotonic
// reading: a process paused past it (SIGSTOP) finds it passed on resume,
// whatever the wall clock did.
// Ended (the lease lost, or about to be released), it stays ended.
type trustWindow struct {
	until atomic.Pointer[time.Time]
	ended atomic.Bool
}

func (w *trustWindow) set(t time.Time) { w.until.Store(&t) }

// end cuts the window short for good.
func (w *trustWindow) end() { w.ended.Store(true) }

// errLeaseGone is the fence's cause once the lease was lost or released.
var errLeaseGone = fmt.Errorf("the lease was lost or released: %w", ferrydriver.ErrLeaseLost)

// check returns errTrustExpired once the window has passed, errLeaseGone
// once it was ended.
func (w *trustWindow) check() error {
	if w.ended.Load() {
		return errLeaseGone
	}
	if u := w.until.Load(); u == nil || !time.Now().Before(*u) {
		return errTrustExpired
	}
	return nil
}

// leaseMargin is how much earlier than the lease's expiry a leader stops
// trusting it.
func leaseMargin(ttl time.Duration) time.Duration { return min(ttl/5, 2*time.Second) }

// maintain refreshes the lag figures every heartbeat and, every
// RetentionInterval, removes published events, forgets idle keys and
// removes expired dead letters, off the publish path (see relay_upkeep.go).
func (r *Relay) maintain(ctx context.Context, ck *checkpointer) {
	hb := time.NewTicker(r.cfg.HeartbeatInterval)
	defer hb.Stop()
	var lastRetention time.Time
	var keys keySweep
	for {
		select {
		case <-ctx.Done():
			return
		case <-hb.C:
		}
		r.refreshLag(ctx)
		if r.retains() && time.Since(lastRetention) >= r.cfg.RetentionInterval {
			lastRetention = time.Now()
			cursor := ck.savedCursor()
			r.retain(ctx, cursor)
			r.pruneKeys(ctx, cursor, &keys)
			r.retainDeadLetters(ctx)
		}
	}
}

// retain removes published events older than Retention, in chunks.
func (r *Relay) retain(ctx context.Context, cursor []byte) {
	if cursor == nil || r.cfg.Retention < 0 {
		return
	}
	const chunk = ferrydriver.RetentionChunk
	total := int64(0)
	for ctx.Err() == nil {
		n, err := r.store.DeleteDelivered(ctx, &ferrydriver.DeleteDeliveredParams{Feed: r.name, Partition: r.cfg.Partition, Cursor: cursor, OlderThan: r.cfg.Retention, Limit: chunk})
		if err != nil {
			if ctx.Err() == nil { // a stop is not a failure
				r.log.Warn("ferry: retention failed; will retry", "err", err)
			}
			return
		}
		total += n
		if n < chunk/2 {
			break
		}
	}
	if total > 0 {
		r.m.removed.WithLabelValues("events").Add(float64(total))
		r.log.Debug("ferry: removed published events", "count", total)
	}
}

func (c *checkpointer) markSaved(cur []byte, seq int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.saved = cur
	if seq > c.savedEvents {
		c.savedEvents = seq
	}
	close(c.progress)
	c.progress = make(chan struct{})
}

// flush saves the latest cursor before the relay stops; the saver
// goroutine must have stopped.
func (c *checkpointer) flush(stop context.Context, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(stop), max(timeout, 0))
	defer cancel()
	if err := c.save(ctx, false); err != nil {
		c.r.log.Warn("ferry: could not save the final checkpoint; the next relay redelivers the last batch", "err", err)
	}
}

// refreshLag sets the lag gauges from FeedLag, whose cost does not grow
// with the backlog (an estimate beyond ferrydriver.ExactCountLimit
// events); dead letters are not counted here at all.
func (r *Relay) refreshLag(ctx context.Context) {
	lag, err := r.store.FeedLag(ctx, &ferrydriver.FeedLagParams{Feed: r.name, Partition: r.cfg.Partition})
	if err != nil {
		return
	}
	var age time.Duration
	if !lag.OldestPending.IsZero() {
		age = max(0, lag.Now.Sub(lag.OldestPending))
	}
	r.m.lagEvents.Set(float64(lag.Events))
	r.m.lagSeconds.Set(age.Seconds())
	r.health.lagged(lag.Events, time.Now())
	r.meter.lagged(lag.Events, age)
}
