package ferry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/internal/backoff"
	"github.com/prometheus/client_golang/prometheus"
)

// RelayConfig configures a Relay. The zero value (or nil) gives the defaults.
type RelayConfig struct {
	// Feed names the outbox feed; the checkpoint and the lease are stored
	// under "<Feed>/<Partition>". Default "default".
	Feed string
	// Partition is the outbox partition this relay reads. Default 0.
	Partition int
	// HolderID identifies this relay in the lease. Default: host-pid-random.
	HolderID string
	// BatchSize is the most events read and published at once. Default 500.
	BatchSize int
	// PollInterval is the longest a committed event waits before the relay
	// looks for it when no wake-up arrives. Default 500 ms.
	PollInterval time.Duration
	// LeaseTTL is how long the relay's lease lasts without renewal; a
	// standby takes over within about this long after the leader dies. The
	// leader renews every LeaseTTL/3 and stops publishing when it could not
	// renew for LeaseTTL minus a safety margin, on its local monotonic clock.
	// Default 15 s; minimum 1 s.
	LeaseTTL time.Duration
	// RetryBase and RetryMax bound the backoff between publish attempts and
	// after database errors. Defaults 100 ms and 30 s.
	RetryBase, RetryMax time.Duration
	// Retention is how long published events stay in the outbox. Default
	// 24 h; a negative value keeps them forever.
	Retention time.Duration
	// RetentionInterval is how often delivered events are removed. Default 1 min.
	RetentionInterval time.Duration
	// HeartbeatInterval is how often an idle relay still saves its checkpoint
	// and refreshes its lag figures. Default 5 s.
	HeartbeatInterval time.Duration
	// ShutdownTimeout bounds how long Run, once its context is cancelled,
	// keeps publishing the batch in flight and saving the checkpoint.
	// Default 10 s.
	ShutdownTimeout time.Duration
	// Logger receives the relay's logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives the relay's Prometheus metrics.
	Registerer prometheus.Registerer
	// DeadLetterRetention is how long the relay keeps the events it
	// dead-lettered (`ferry dlq list|show|redrive|discard`); its retention
	// pass, every RetentionInterval, removes older ones. Default 14 days; a
	// negative value keeps them forever.
	DeadLetterRetention time.Duration
	// KeyRetention is how long a key must have had no new event, with
	// every event of it delivered, before the retention pass forgets its
	// sequence: the key's next event starts Seq at 1 again (see
	// ferryevent.Event.Seq), and the outbox's keys table stays bounded.
	// Default: Retention, so that a key is forgotten about when its events
	// have left the outbox; a negative value never forgets a key (Seq
	// never restarts, and the table keeps a row for every key ever used).
	KeyRetention time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *RelayConfig) WithDefaults() RelayConfig {
	out := RelayConfig{}
	if c != nil {
		out = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if out.Feed == "" {
		out.Feed = "default"
	}
	if out.HolderID == "" {
		host, _ := os.Hostname()
		out.HolderID = fmt.Sprintf("%s-%d-%04x", host, os.Getpid(), rand.IntN(1<<16))
	}
	if out.BatchSize == 0 {
		out.BatchSize = 500
	}
	def(&out.PollInterval, 500*time.Millisecond)
	def(&out.LeaseTTL, 15*time.Second)
	def(&out.RetryBase, 100*time.Millisecond)
	def(&out.RetryMax, 30*time.Second)
	def(&out.Retention, 24*time.Hour)
	def(&out.RetentionInterval, time.Minute)
	def(&out.HeartbeatInterval, 5*time.Second)
	def(&out.ShutdownTimeout, 10*time.Second)
	def(&out.DeadLetterRetention, 14*24*time.Hour)
	def(&out.KeyRetention, out.Retention)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *RelayConfig) validate() error {
	switch {
	case c.BatchSize < 1:
		return fmt.Errorf("ferry: RelayConfig.BatchSize is %d: use at least 1 (default 500)", c.BatchSize)
	case c.Partition < 0:
		return fmt.Errorf("ferry: RelayConfig.Partition is %d: partitions are numbered from 0", c.Partition)
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("ferry: RelayConfig.PollInterval is %v: use at least 1ms (default 500ms)", c.PollInterval)
	case c.LeaseTTL < time.Second:
		return fmt.Errorf("ferry: RelayConfig.LeaseTTL is %v: use at least 1s (default 15s)", c.LeaseTTL)
	case c.RetryBase <= 0 || c.RetryMax < c.RetryBase:
		return fmt.Errorf("ferry: RelayConfig.RetryBase (%v) must be positive and at most RetryMax (%v)", c.RetryBase, c.RetryMax)
	case c.RetentionInterval <= 0 || c.HeartbeatInterval <= 0 || c.ShutdownTimeout <= 0:
		return fmt.Errorf("ferry: RelayConfig.RetentionInterval, HeartbeatInterval and ShutdownTimeout must be positive")
	}
	return nil
}

// Relay tails one outbox partition and publishes it to a sink: in commit
// order per key, at least once, with the checkpoint saved only after the
// sink acknowledged (or the event was dead-lettered). One relay per feed is
// active at a time, by a lease fenced with a term; others wait as standbys.
type Relay struct {
	store   ferrydriver.Store
	sink    ferrysink.Sink
	cfg     RelayConfig
	name    string
	log     *slog.Logger
	m       *relayMetrics
	ordered bool
	retry   backoff.Policy
	dups    ferrysink.DuplicateReporter // nil if the sink cannot tell
	lastDup uint64
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
	m, err := newRelayMetrics(c.Registerer, name)
	if err != nil {
		return nil, err
	}
	ob, _ := sink.(ferrysink.OrderedBatcher)
	return &Relay{
		store: store, sink: sink, cfg: c, name: name, m: m,
		log:     c.Logger.With("feed", name, "holder", c.HolderID),
		ordered: ob != nil && ob.OrderedBatches(),
		retry:   backoff.Policy{Base: c.RetryBase, Max: c.RetryMax},
		dups:    dupReporter(sink),
	}, nil
}

func dupReporter(s ferrysink.Sink) ferrysink.DuplicateReporter {
	d, _ := s.(ferrysink.DuplicateReporter)
	return d
}

// FeedName returns "<Feed>/<Partition>", the name of the relay's checkpoint
// and lease.
func (r *Relay) FeedName() string { return r.name }

// Run relays until ctx is cancelled, then finishes the batch in flight,
// saves the checkpoint, releases the lease and returns nil. It returns an
// error only for a configuration problem it cannot recover from (such as a
// missing schema); database and broker outages are retried.
func (r *Relay) Run(ctx context.Context) error {
	attempt := 0
	for ctx.Err() == nil {
		asked := time.Now()
		lease, err := r.store.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: r.name, Holder: r.cfg.HolderID, TTL: r.cfg.LeaseTTL})
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(err, ferrydriver.ErrSchemaMissing) {
				return err
			}
			attempt++
			r.log.Warn("ferry: relay cannot reach its store; retrying", "err", err, "attempt", attempt)
			r.retry.Sleep(ctx.Done(), attempt)
			continue
		}
		if !lease.Held(r.cfg.HolderID) {
			r.m.leader.Set(0)
			// Standby: try again well within the TTL, with jitter.
			sleepCtx(ctx, r.cfg.LeaseTTL/4+time.Duration(rand.Int64N(int64(r.cfg.LeaseTTL/8))))
			continue
		}
		attempt = 0
		r.log.Info("ferry: relay is the leader", "term", lease.Term)
		err = r.lead(ctx, lease, asked)
		r.m.leader.Set(0)
		switch {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, ferrydriver.ErrLeaseLost):
			r.log.Warn("ferry: relay lost its lease; standing by", "term", lease.Term, "err", err)
		case errors.Is(err, ferrydriver.ErrSchemaMissing):
			return err
		default:
			attempt++
			r.log.Error("ferry: relay stopped leading after an error; retrying", "err", err, "attempt", attempt)
			r.retry.Sleep(ctx.Done(), attempt)
		}
	}
	return nil
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

// lead runs one term of leadership. asked is when the lease was requested:
// the local trust window is measured from then, before the database set
// the expiry, so it always ends before the lease does.
func (r *Relay) lead(stop context.Context, lease *ferrydriver.Lease, asked time.Time) error {
	r.m.leader.Set(1)
	// leaseCtx ends when the lease is lost (or on return), not when stop
	// ends: a stopping relay still finishes its batch in flight.
	leaseCtx, loseLease := context.WithCancelCause(context.WithoutCancel(stop))
	var wg sync.WaitGroup
	defer func() {
		loseLease(nil)
		wg.Wait()
	}()
	wg.Go(func() { r.keepLease(leaseCtx, lease, loseLease, asked) })

	cp, err := r.store.LoadCheckpoint(leaseCtx, &ferrydriver.LoadCheckpointParams{Feed: r.name})
	if err != nil {
		return err
	}
	feed, err := r.store.OpenFeed(leaseCtx, &ferrydriver.OpenFeedParams{Feed: r.name, Partition: r.cfg.Partition, Cursor: cp.Cursor})
	if err != nil {
		return err
	}
	defer feed.Close()

	ck := newCheckpointer(r, lease.Term, cp.Cursor, loseLease)
	ckCtx, stopCk := context.WithCancel(leaseCtx)
	ckDone := make(chan struct{})
	go func() { defer close(ckDone); ck.run(ckCtx) }()
	defer func() { stopCk(); <-ckDone }()
	wg.Go(func() { r.maintain(leaseCtx, ck) })

	// readCtx also ends on stop: no new batch is started after it.
	readCtx, cancelRead := context.WithCancel(leaseCtx)
	defer cancelRead()
	stopRead := context.AfterFunc(stop, cancelRead)
	defer stopRead()

	// The next batch is read while the current one is published.
	reads := make(chan readResult, 1)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		r.readAhead(readCtx, feed, reads)
	}()
	defer func() { cancelRead(); <-readerDone }()

	for stop.Err() == nil {
		var res readResult
		select {
		case res = <-reads:
		case <-readCtx.Done():
		}
		if res.batch == nil {
			if leaseCtx.Err() != nil {
				return context.Cause(leaseCtx)
			}
			if stop.Err() != nil {
				break
			}
			return fmt.Errorf("read feed %s: %w", r.name, res.err)
		}
		batch := res.batch
		if err := r.deliver(stop, leaseCtx, lease.Term, batch); err != nil {
			if stop.Err() != nil && leaseCtx.Err() == nil {
				break // stopping mid-batch: not checkpointed, redelivered later
			}
			return err
		}
		// At most two delivered batches are ever unsaved: the one the
		// checkpointer is saving and this one. That bounds what a crash
		// redelivers.
		if err := ck.advance(readCtx, batch.Cursor, len(batch.Events)+len(batch.Invalid) > 0); err != nil {
			if leaseCtx.Err() != nil {
				return context.Cause(leaseCtx)
			}
			break // stopping: flush below
		}
	}
	cancelRead()
	<-readerDone
	// Stopping: save the last cursor, then hand the lease over at once.
	stopCk()
	<-ckDone
	ck.flush(stop, r.cfg.ShutdownTimeout)
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(stop), r.cfg.ShutdownTimeout)
	defer cancel()
	loseLease(errStopping)
	if err := r.store.ReleaseLease(relCtx, &ferrydriver.ReleaseLeaseParams{Name: r.name, Holder: r.cfg.HolderID, Term: lease.Term}); err != nil {
		r.log.Warn("ferry: could not release the lease; a standby takes over when it expires", "err", err)
	}
	return nil
}

var errStopping = errors.New("relay stopping")

type readResult struct {
	batch *ferrydriver.Batch
	err   error
}

// readAhead reads batches in order into out until ctx ends or a read fails
// (the failure is sent as the last result).
func (r *Relay) readAhead(ctx context.Context, feed ferrydriver.Feed, out chan<- readResult) {
	for {
		b, err := feed.Read(ctx, &ferrydriver.ReadParams{Max: r.cfg.BatchSize, Wait: r.cfg.PollInterval})
		if err != nil && ctx.Err() != nil {
			return
		}
		select {
		case out <- readResult{batch: b, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// keepLease renews the lease every TTL/3 and cancels leaseCtx when it is
// lost or when the local trust window ends. The window is the lease's
// remaining time as the database granted it, minus a margin, counted on the
// local monotonic clock from before the request that obtained it.
func (r *Relay) keepLease(ctx context.Context, lease *ferrydriver.Lease, lose context.CancelCauseFunc, asked time.Time) {
	ttl := r.cfg.LeaseTTL
	margin := min(ttl/5, 2*time.Second)
	trustUntil := asked.Add(lease.ExpiresAt.Sub(lease.Now) - margin)
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
			l, err := r.store.RenewLease(rctx, &ferrydriver.RenewLeaseParams{Name: r.name, Holder: r.cfg.HolderID, Term: lease.Term, TTL: ttl})
			cancel()
			switch {
			case err == nil:
				trustUntil = start.Add(l.ExpiresAt.Sub(l.Now) - margin)
			case errors.Is(err, ferrydriver.ErrLeaseLost):
				lose(err)
				return
			default:
				r.log.Warn("ferry: lease renewal failed; will retry until the lease's trust window ends", "err", err, "trust_left", time.Until(trustUntil).Round(time.Millisecond))
			}
		}
	}
}

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

// deliver publishes a batch and dead-letters what cannot be published. It
// returns only when every event is acknowledged or dead-lettered, or with
// an error when the lease is lost or stop ends mid-way.
func (r *Relay) deliver(stop, leaseCtx context.Context, term int64, b *ferrydriver.Batch) error {
	var dead []*ferrydriver.DeadLetter
	for _, inv := range b.Invalid {
		dead = append(dead, &ferrydriver.DeadLetter{Feed: r.name, Event: inv.Event, Reason: inv.Reason})
	}
	start := time.Now()
	waves := r.waves(b.Events)
	for _, wave := range waves {
		d, err := r.publishWave(stop, leaseCtx, wave)
		if err != nil {
			return err
		}
		dead = append(dead, d...)
	}
	if len(dead) > 0 {
		if err := r.store.InsertDeadLetters(leaseCtx, &ferrydriver.InsertDeadLettersParams{Feed: r.name, Holder: r.cfg.HolderID, Term: term, DeadLetters: dead}); err != nil {
			return fmt.Errorf("store %d dead letter(s): %w", len(dead), err)
		}
		for _, d := range dead {
			r.log.Warn("ferry: event dead-lettered", "event_id", d.Event.ID, "key", d.Event.Key, "topic", d.Event.Topic, "reason", d.Reason)
		}
		r.m.deadLetters.Add(float64(len(dead)))
	}
	if n := len(b.Events); n > 0 {
		r.m.batches.Inc()
		r.m.batchSize.Observe(float64(n))
		r.m.published.Add(float64(n - len(dead) + len(b.Invalid)))
		r.m.publishSeconds.Observe(time.Since(start).Seconds())
		oldest := b.Events[0].CreatedAt
		for _, e := range b.Events {
			if e.CreatedAt.Before(oldest) {
				oldest = e.CreatedAt
			}
		}
		r.m.lagSeconds.Set(max(0, time.Since(oldest).Seconds()))
	}
	if r.dups != nil {
		if n := r.dups.Duplicates(); n > r.lastDup {
			r.log.Info("ferry: destination dropped duplicates", "count", n-r.lastDup)
			r.m.duplicates.Add(float64(n - r.lastDup))
			r.lastDup = n
		}
	}
	return nil
}

// waves splits events so that no wave has two events of one key and each
// key's events are in successive waves, in order. A sink that keeps order
// within a call gets a single wave.
func (r *Relay) waves(events []*ferryevent.Event) [][]*ferryevent.Event {
	if len(events) == 0 {
		return nil
	}
	if r.ordered {
		return [][]*ferryevent.Event{events}
	}
	depth := make(map[string]int, len(events))
	var out [][]*ferryevent.Event
	for _, e := range events {
		i := depth[e.Key]
		depth[e.Key] = i + 1
		if i == len(out) {
			out = append(out, make([]*ferryevent.Event, 0, len(events)/(i+1)))
		}
		out[i] = append(out[i], e)
	}
	return out
}

// publishWave publishes events (distinct keys) until each is acknowledged
// or permanently failed, retrying the rest with backoff.
func (r *Relay) publishWave(stop, leaseCtx context.Context, events []*ferryevent.Event) ([]*ferrydriver.DeadLetter, error) {
	var dead []*ferrydriver.DeadLetter
	pending := events
	for attempt := 1; ; attempt++ {
		if err := leaseCtx.Err(); err != nil {
			return nil, context.Cause(leaseCtx)
		}
		results := r.sink.Publish(leaseCtx, pending)
		if len(results) != len(pending) {
			return nil, fmt.Errorf("sink returned %d results for %d events", len(results), len(pending))
		}
		var retry []*ferryevent.Event
		var firstErr error
		for i, err := range results {
			switch {
			case err == nil:
			case ferrysink.IsPermanent(err):
				dead = append(dead, &ferrydriver.DeadLetter{Feed: r.name, Event: *pending[i], Reason: err.Error()})
			default:
				retry = append(retry, pending[i])
				if firstErr == nil {
					firstErr = err
				}
			}
		}
		if len(retry) == 0 {
			return dead, nil
		}
		r.m.retries.Add(float64(len(retry)))
		if leaseCtx.Err() != nil {
			return nil, context.Cause(leaseCtx)
		}
		if stop.Err() != nil {
			return nil, fmt.Errorf("stopping with %d event(s) unpublished: %w", len(retry), firstErr)
		}
		r.log.Warn("ferry: publish failed; retrying with backoff", "events", len(retry), "attempt", attempt, "err", firstErr)
		done := make(chan struct{})
		stopWait := context.AfterFunc(stop, func() { close(done) })
		stopLease := context.AfterFunc(leaseCtx, func() {
			if stopWait() {
				close(done)
			}
		})
		r.retry.Sleep(done, attempt)
		stopWait()
		stopLease()
		pending = retry
	}
}

// retain removes published events older than Retention, in chunks.
func (r *Relay) retain(ctx context.Context, cursor []byte) {
	if cursor == nil || r.cfg.Retention < 0 {
		return
	}
	const chunk = 5000
	total := int64(0)
	for ctx.Err() == nil {
		n, err := r.store.DeleteDelivered(ctx, &ferrydriver.DeleteDeliveredParams{Feed: r.name, Partition: r.cfg.Partition, Cursor: cursor, OlderThan: r.cfg.Retention, Limit: chunk})
		if err != nil {
			r.log.Warn("ferry: retention failed; will retry", "err", err)
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

// checkpointer saves the newest cursor handed to it, off the publish path,
// and at least every HeartbeatInterval.
type checkpointer struct {
	r    *Relay
	term int64
	lose context.CancelCauseFunc
	wake chan struct{}

	mu sync.Mutex // guards the fields below
	// latest is the newest cursor, seq the number of non-empty batches
	// delivered up to it; saved and savedSeq what the store has.
	latest, saved []byte
	seq, savedSeq int64
	// progress is closed and replaced after every save.
	progress chan struct{}
}

func newCheckpointer(r *Relay, term int64, saved []byte, lose context.CancelCauseFunc) *checkpointer {
	return &checkpointer{r: r, term: term, lose: lose, wake: make(chan struct{}, 1), saved: saved, latest: saved, progress: make(chan struct{})}
}

// advance records a delivered batch's cursor. A batch with events wakes the
// saver; then advance waits until at most this batch and the one before it
// are unsaved. An empty batch's cursor waits for the next heartbeat.
func (c *checkpointer) advance(ctx context.Context, cursor []byte, delivered bool) error {
	c.mu.Lock()
	c.latest = cursor
	if !delivered {
		c.mu.Unlock()
		return nil
	}
	c.seq++
	want := c.seq - 1
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	for {
		c.mu.Lock()
		ok, progress := c.savedSeq >= want, c.progress
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *checkpointer) savedCursor() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.saved
}

func (c *checkpointer) run(ctx context.Context) {
	hb := time.NewTicker(c.r.cfg.HeartbeatInterval)
	defer hb.Stop()
	retry := 0
	for {
		heartbeat := false
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-hb.C:
			heartbeat = true
		}
		if err := c.save(ctx, heartbeat); err != nil && ctx.Err() == nil {
			retry++
			c.r.log.Warn("ferry: saving the checkpoint failed; will retry", "err", err, "attempt", retry)
			c.r.retry.Sleep(ctx.Done(), retry)
			select {
			case c.wake <- struct{}{}:
			default:
			}
			continue
		}
		retry = 0
	}
}

// save stores the latest cursor if it changed (or always, for a heartbeat,
// which also shows operators that the relay is alive).
func (c *checkpointer) save(ctx context.Context, heartbeat bool) error {
	c.mu.Lock()
	cur, seq, saved := c.latest, c.seq, c.saved
	c.mu.Unlock()
	if cur == nil || (!heartbeat && bytes.Equal(cur, saved)) {
		c.markSaved(cur, seq)
		return nil
	}
	err := c.r.store.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: c.r.name, Partition: c.r.cfg.Partition, Cursor: cur, Holder: c.r.cfg.HolderID, Term: c.term})
	if errors.Is(err, ferrydriver.ErrLeaseLost) {
		c.lose(err)
		return nil
	}
	if err != nil {
		return err
	}
	c.r.m.checkpoints.Inc()
	c.markSaved(cur, seq)
	return nil
}

func (c *checkpointer) markSaved(cur []byte, seq int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.saved = cur
	if seq > c.savedSeq {
		c.savedSeq = seq
	}
	close(c.progress)
	c.progress = make(chan struct{})
}

// flush saves the latest cursor before the relay stops; the saver
// goroutine must have stopped.
func (c *checkpointer) flush(stop context.Context, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(stop), timeout)
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
	r.m.lagEvents.Set(float64(lag.Events))
	if lag.OldestPending.IsZero() {
		r.m.lagSeconds.Set(0)
	} else {
		r.m.lagSeconds.Set(max(0, lag.Now.Sub(lag.OldestPending).Seconds()))
	}
}
