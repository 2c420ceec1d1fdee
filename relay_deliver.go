package ferry

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferrysink"
)

// The relay's delivery pipeline. Every key is a queue of its own: a key's
// head event is handed to the sink as soon as the key's previous event is
// acknowledged, whatever the other keys do, and several sink calls run at
// once. A key whose head is not acknowledged in time (its destination
// hangs or keeps failing) only waits itself; if the store is a
// ferrydriver.Parker, its events are set aside in the store ("parked"), so
// that the checkpoint and the read-ahead move on, and are published from
// there, in order, once the destination recovers.
//
// Bounds: a batch is taken only while the events read since the oldest one
// not yet acknowledged (or parked) are fewer than a batch, and those plus
// the ones delivered but not yet checkpointed fewer than two batches. So at
// most two batches lie past the saved checkpoint, which is what a crash
// can redeliver, plus the head of each parked key (it may have reached the
// destination before the crash and is published again from the store),
// and the next batch's publishing overlaps the previous one's checkpoint. All state is owned by the goroutine running
// pipeline.run; sink calls report back through outcomes.

// windowBatches is how many batches' worth of events may lie past the saved
// checkpoint.
const windowBatches = 2

// pipeline is one leadership's delivery state.
type pipeline struct {
	r      *Relay
	term   int64
	pubCtx context.Context // ends when publishing must: lease lost, shutdown timeout
	ck     *checkpointer
	parker ferrydriver.Parker // nil: keys are kept apart in memory only
	// parkStuck: stuck keys are parked (not RelayConfig.DisableParking);
	// without it the parker serves the keys of redriven dead letters only.
	parkStuck bool
	trust     *trustWindow // no hand-off to the sink after it ends

	keys    map[string]*keyState
	ready   []*keyState // keys whose head can be sent now, oldest first
	backoff keyHeap     // keys waiting for a retry
	batches []*batchState
	behind  int // events of the batches in p.batches
	// inFlight counts events handed to the sink, outcome unknown; calls
	// counts sink calls that have not returned.
	inFlight, calls int
	// needHeads are parked keys whose next event must be read from the store.
	needHeads map[*keyState]bool
	// parkedBeyond: the store holds parked keys that are not loaded (more
	// than the load cap). Until a scan loads them all, a key the pipeline
	// does not know is looked up in the store before its events are
	// taken, so that none is published ahead of the key's parked ones.
	parkedBeyond bool
	lastAck      time.Time
	lastScan     time.Time
	outcomes     outcomeQueue
	wg           sync.WaitGroup
}

type batchState struct {
	cursor  []byte
	left    int // events neither acknowledged, dead-lettered nor parked
	size    int
	invalid int
	read    time.Time
	oldest  time.Time
}

// entry is one event in a key's queue.
type entry struct {
	ev   *ferryevent.Event
	b    *batchState // nil once parked, and for heads loaded from the store
	done bool
	err  error
}

type keyState struct {
	key string
	q   []*entry
	// busy counts q's leading entries in flight (more than one only for
	// an OrderedBatcher).
	busy     int
	attempts int
	// since is when the head's first attempt was sent.
	since   time.Time
	lastErr error
	retryAt time.Time
	inReady bool
	heapIdx int // index in the backoff heap, -1 when not in it
	// parked: the key's queue is in the store, and q holds at most its
	// head; held: the head is not retried until an operator releases it.
	parked, held bool
	// parkedAt is when an earlier leader parked the head (for Health).
	parkedAt time.Time
}

// fresh forgets the failures of k's previous head.
func (k *keyState) fresh() {
	k.attempts, k.since, k.lastErr, k.parkedAt = 0, time.Time{}, nil, time.Time{}
}

// headFrom makes h, read from the store, k's head, with the failed
// attempts a leader recorded with it (SetParkedAttempts): MaxAttempts and
// MaxAge count across leaderships.
func (k *keyState) headFrom(h *ferrydriver.ParkedEvent) {
	ev := h.Event
	k.q = append(k.q, &entry{ev: &ev})
	k.attempts, k.since, k.lastErr = h.Attempts, h.FirstFailure, nil
}

// callOutcome is one event's outcome reported by a sink call.
type callOutcome struct {
	c   *call
	i   int
	err error
	end bool // the call returned; i and err are unused
}

type call struct {
	events []*ferryevent.Event
	owners []*keyState
	items  []*entry
}

// outcomeQueue is an unbounded queue from the sink calls to the pipeline,
// so that a sink's goroutines never wait for the pipeline.
type outcomeQueue struct {
	mu     sync.Mutex
	items  []callOutcome
	signal chan struct{}
}

func (q *outcomeQueue) push(o callOutcome) {
	q.mu.Lock()
	q.items = append(q.items, o)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *outcomeQueue) take() []callOutcome {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.items
	q.items = nil
	return out
}

func newPipeline(r *Relay, term int64, pubCtx context.Context, ck *checkpointer, trust *trustWindow) *pipeline {
	p := &pipeline{r: r, term: term, pubCtx: pubCtx, ck: ck, trust: trust,
		keys: map[string]*keyState{}, needHeads: map[*keyState]bool{}, lastAck: time.Now()}
	p.outcomes.signal = make(chan struct{}, 1)
	if pk, ok := r.store.(ferrydriver.Parker); ok {
		p.parker, p.parkStuck = pk, !r.cfg.DisableParking
	}
	return p
}

// run delivers what reads brings until stop ends (then it lets the calls in
// flight finish, until pubCtx ends) or a read fails. It returns the read's
// error, the lease's cause, or nil when stopped.
func (p *pipeline) run(stop context.Context, reads <-chan readResult) error {
	defer p.wg.Wait()
	defer p.r.reportDuplicates(true)
	if err := p.loadParked(); err != nil {
		return err
	}
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	lingering, lingered := false, false
	var wake *time.Timer
	heartbeat := time.NewTicker(p.r.cfg.HeartbeatInterval)
	defer heartbeat.Stop()
	// stopping: no more reads or sends; the calls in flight may finish
	// (until pubCtx ends, or for StallTimeout after a failed read).
	stopping := false
	var readErr error
	var draining <-chan time.Time
	for {
		if err := p.pubCtx.Err(); err != nil && !stopping {
			return context.Cause(p.pubCtx)
		}
		if stopping && p.inFlight == 0 {
			return readErr
		}
		var readCh <-chan readResult
		var saved <-chan struct{}
		if !stopping {
			// The channel is taken before the second look, so that a save
			// completing in between still wakes the loop.
			progressed := p.ck.progressed()
			if p.canRead() {
				readCh = reads
			} else if p.ck.unsaved() > 0 {
				saved = progressed
			}
		}
		var wakeC <-chan time.Time
		if next, ok := p.nextWake(); ok && !stopping {
			if wake == nil {
				wake = time.NewTimer(time.Until(next))
			} else {
				wake.Reset(time.Until(next))
			}
			wakeC = wake.C
		}
		var stopC <-chan struct{}
		if !stopping {
			stopC = stop.Done()
		}
		select {
		case res := <-readCh:
			if res.batch == nil {
				// Let what is in flight be acknowledged, so that the
				// checkpoint saved before the feed is reopened covers it.
				readErr, stopping = res.err, true
				t := time.NewTimer(p.r.cfg.StallTimeout)
				defer t.Stop()
				draining = t.C
				continue
			}
			if err := p.add(res.batch); err != nil {
				return err
			}
		case <-p.outcomes.signal:
			if err := p.settle(p.outcomes.take()); err != nil {
				return err
			}
		case <-saved:
		case <-wakeC:
		case <-linger.C:
			lingering, lingered = false, true
		case <-heartbeat.C:
			p.reportStuck(time.Now())
			p.r.reportDuplicates(false)
			if err := p.checkHeld(); err != nil {
				return err
			}
			if err := p.adoptRedriven(); err != nil {
				return err
			}
			if err := p.rescanParked(); err != nil {
				return err
			}
		case <-stopC:
			stopping = true
			continue
		case <-draining:
			return readErr
		case <-p.pubCtx.Done():
			if !stopping {
				return context.Cause(p.pubCtx)
			}
			// Stopping, and the shutdown timeout is up: what is still in
			// flight is abandoned (its calls report it as failed).
			if err := p.settle(p.outcomes.take()); err != nil {
				return err
			}
			if p.inFlight > 0 {
				p.r.log.Warn("ferry: stopping with events still unacknowledged; the next leader publishes them again", "events", p.inFlight)
				return readErr
			}
		}
		if wake != nil {
			wake.Stop()
		}
		if stopping {
			continue
		}
		if err := p.park(); err != nil {
			return err
		}
		if err := p.loadHeads(); err != nil {
			return err
		}
		p.releaseBackoff(time.Now())
		// While other calls are in flight, a small call waits a moment for
		// company.
		if len(p.ready) > 0 {
			if p.calls == 0 || len(p.ready) >= p.minCall() || lingered {
				p.dispatch()
				lingered = false
			} else if !lingering {
				linger.Reset(time.Millisecond)
				lingering = true
			}
		}
		p.advance()
	}
}

func (p *pipeline) minCall() int { return min(64, p.r.cfg.BatchSize) }

// canRead reports whether the next batch may be taken: the window has room
// and the checkpointer is not more than one position behind.
func (p *pipeline) canRead() bool {
	b := p.r.cfg.BatchSize
	return p.behind < b && p.behind+p.ck.unsaved() < windowBatches*b
}

// nextWake returns the earliest retry time among keys in backoff, or the
// next time a stalled key may be parked.
func (p *pipeline) nextWake() (time.Time, bool) {
	var next time.Time
	ok := false
	if len(p.backoff) > 0 {
		next, ok = p.backoff[0].retryAt, true
	}
	if p.parkStuck && p.inFlight > 0 {
		// Re-examine stalled keys every StallTimeout/4.
		t := time.Now().Add(p.r.cfg.StallTimeout / 4)
		if !ok || t.Before(next) {
			next, ok = t, true
		}
	}
	return next, ok
}

// add takes a batch into the pipeline.
func (p *pipeline) add(b *ferrydriver.Batch) error {
	bs := &batchState{cursor: b.Cursor, size: len(b.Events), invalid: len(b.Invalid), read: time.Now()}
	if len(b.Invalid) > 0 {
		dead := make([]*ferrydriver.DeadLetter, 0, len(b.Invalid))
		for _, inv := range b.Invalid {
			dead = append(dead, &ferrydriver.DeadLetter{Feed: p.r.name, Event: inv.Event, Reason: inv.Reason})
		}
		if err := p.deadLetter(dead); err != nil {
			return err
		}
	}
	if err := p.lookUpParked(b.Events); err != nil {
		return err
	}
	var toPark []*ferryevent.Event
	for _, ev := range b.Events {
		if bs.oldest.IsZero() || ev.CreatedAt.Before(bs.oldest) {
			bs.oldest = ev.CreatedAt
		}
		k := p.keys[ev.Key]
		if k == nil {
			k = &keyState{key: ev.Key, heapIdx: -1}
			p.keys[ev.Key] = k
		}
		if k.parked {
			toPark = append(toPark, ev)
			continue
		}
		bs.left++
		k.q = append(k.q, &entry{ev: ev, b: bs})
		p.markReady(k)
	}
	if len(toPark) > 0 {
		// The keys are parked: their new events join their queues in the
		// store, behind what is there.
		if err := p.parker.ParkEvents(p.pubCtx, &ferrydriver.ParkEventsParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term, Events: toPark}); err != nil {
			return p.storeErr("park events of stuck keys", err)
		}
		p.r.m.parkedEvents.Add(float64(len(toPark)))
	}
	if n := len(b.Events); n > 0 {
		p.r.m.batches.Inc()
		p.r.m.batchSize.Observe(float64(n))
	}
	p.batches = append(p.batches, bs)
	p.behind += bs.size
	p.advance()
	return nil
}

// markReady queues k for sending if its head can go now.
func (p *pipeline) markReady(k *keyState) {
	if k.inReady || k.busy > 0 || len(k.q) == 0 || k.held || k.heapIdx >= 0 {
		return
	}
	k.inReady = true
	p.ready = append(p.ready, k)
}

// releaseBackoff makes keys whose retry time has come ready.
func (p *pipeline) releaseBackoff(now time.Time) {
	for len(p.backoff) > 0 && !p.backoff[0].retryAt.After(now) {
		k := heap.Pop(&p.backoff).(*keyState)
		p.markReady(k)
	}
}

// dispatch hands ready keys' heads to the sink, in calls of at most
// BatchSize events, while the in-flight limit allows.
func (p *pipeline) dispatch() {
	limit := windowBatches * p.r.cfg.BatchSize
	for len(p.ready) > 0 && p.inFlight < limit {
		if p.trust.check() != nil {
			// The lease can no longer be proven: hand nothing more to
			// the sink. keepLease ends the leadership.
			return
		}
		c := &call{}
		now := time.Now()
		for len(p.ready) > 0 && len(c.events) < p.r.cfg.BatchSize && p.inFlight+len(c.events) < limit {
			k := p.ready[0]
			p.ready[0] = nil
			p.ready = p.ready[1:]
			k.inReady = false
			if k.busy > 0 || len(k.q) == 0 || k.held || k.heapIdx >= 0 {
				continue
			}
			n := 1
			if p.r.ordered {
				n = min(len(k.q), p.r.cfg.BatchSize-len(c.events))
			}
			if k.since.IsZero() {
				k.since = now
			}
			for _, e := range k.q[:n] {
				e.done, e.err = false, nil
				c.events = append(c.events, e.ev)
				c.owners = append(c.owners, k)
				c.items = append(c.items, e)
			}
			k.busy = n
		}
		if len(c.events) == 0 {
			return
		}
		p.inFlight += len(c.events)
		p.calls++
		// The sink checks the fence before it hands each event over: a
		// leader paused mid-call hands nothing more over once resumed.
		ctx := ferrysink.WithFence(p.pubCtx, p.trust.check)
		p.wg.Go(func() {
			p.r.publishEach(ctx, c.events, func(i int, err error) { p.outcomes.push(callOutcome{c: c, i: i, err: err}) })
			p.outcomes.push(callOutcome{c: c, end: true})
		})
	}
}

// publishEach runs one sink call and reports every event's outcome exactly
// once: as the sink reports it (EachPublisher), when the call returns, or
// as abandoned when ctx ends first (a sink that does not honour ctx cannot
// hold a stopping relay past its ShutdownTimeout).
func (r *Relay) publishEach(ctx context.Context, events []*ferryevent.Event, done func(int, error)) {
	reported := make([]atomic.Bool, len(events))
	start := time.Now()
	report := func(i int, err error) {
		if i >= 0 && i < len(events) && reported[i].CompareAndSwap(false, true) {
			for _, h := range r.hooks {
				h.OnPublish(&ferryhook.PublishInfo{Feed: r.name, System: r.system, Event: events[i], Start: start, Err: err})
			}
			done(i, err)
		}
	}
	returned := make(chan []error, 1)
	go func() {
		var res []error
		if ep, ok := r.sink.(ferrysink.EachPublisher); ok {
			res = ep.PublishEach(ctx, events, report)
		} else {
			res = r.sink.Publish(ctx, events)
		}
		returned <- res
	}()
	select {
	case res := <-returned:
		for i := range events {
			if len(res) != len(events) {
				report(i, fmt.Errorf("sink returned %d results for %d events", len(res), len(events)))
				continue
			}
			report(i, res[i])
		}
	case <-ctx.Done():
		for i := range events {
			report(i, fmt.Errorf("publish abandoned: %w", context.Cause(ctx)))
		}
	}
}

// settle applies reported outcomes.
func (p *pipeline) settle(outs []callOutcome) error {
	touched := map[*keyState]bool{}
	for _, o := range outs {
		if o.end {
			p.calls--
			continue
		}
		e, k := o.c.items[o.i], o.c.owners[o.i]
		if e.done {
			continue
		}
		e.done, e.err = true, o.err
		p.inFlight--
		touched[k] = true
	}
	// Refused events' batches count them as done only once their dead
	// letters are stored: a checkpoint must not pass an event that is
	// neither published nor dead-lettered.
	var dead []*ferrydriver.DeadLetter
	var deadIn []*batchState
	acked := 0
	now := time.Now()
	for k := range touched {
		// A key's outcomes are applied once all of its events in flight
		// have one, in queue order.
		waiting := false
		for _, e := range k.q[:k.busy] {
			if !e.done {
				waiting = true
				break
			}
		}
		if waiting {
			continue
		}
		n := k.busy
		k.busy = 0
		var failed error
		for i := 0; i < n && len(k.q) > 0; i++ {
			e := k.q[0]
			if failed != nil {
				break // later events of a failed one are sent again after it
			}
			switch {
			case e.err == nil:
				acked++
				p.lastAck = now
				p.r.meter.did(now, 0, e.ev.CreatedAt)
				if err := p.finish(k, e, nil); err != nil {
					return err
				}
			case ferrysink.IsPermanent(e.err):
				dl := &ferrydriver.DeadLetter{Feed: p.r.name, Event: *e.ev, Reason: e.err.Error()}
				if k.parked {
					// Removed from the parked queue and dead-lettered in
					// one write; reported as the unparked path's are.
					if err := p.finish(k, e, dl); err != nil {
						return err
					}
					p.r.log.WarnContext(withEvent(p.pubCtx, e.ev), "ferry: event dead-lettered", "event_id", e.ev.ID, "key", e.ev.Key, "topic", e.ev.Topic, "reason", dl.Reason)
					p.r.m.deadLetters.Inc()
					p.r.meter.fail(0, 1)
					p.r.alert(p.pubCtx, &StuckKey{Feed: p.r.name, Key: k.key, Event: *e.ev, State: KeyDeadLettered, Attempts: k.attempts, Since: k.since, Err: e.err})
				} else {
					dead = append(dead, dl)
					deadIn = append(deadIn, e.b)
					k.q = k.q[1:]
					k.fresh()
				}
			default:
				failed = e.err
			}
		}
		if failed != nil {
			if err := p.failed(k, failed, now); err != nil {
				return err
			}
			continue
		}
		p.markReady(k)
		p.forget(k)
	}
	if len(dead) > 0 {
		if err := p.deadLetter(dead); err != nil {
			return err
		}
		for _, b := range deadIn {
			if b != nil {
				b.left--
			}
		}
	}
	if acked > 0 {
		p.r.m.published.Add(float64(acked))
	}
	p.r.reportDuplicates(false)
	p.advance()
	return nil
}

// finish removes k's acknowledged (or, with dl, dead-lettered) head.
func (p *pipeline) finish(k *keyState, e *entry, dl *ferrydriver.DeadLetter) error {
	if k.parked {
		if err := p.parker.UnparkEvent(p.pubCtx, &ferrydriver.UnparkEventParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term, Key: k.key, EventID: e.ev.ID, DeadLetter: dl}); err != nil {
			return p.storeErr("remove a published event of a parked key", err)
		}
		p.needHeads[k] = true
	}
	k.q = k.q[1:]
	k.fresh()
	if e.b != nil {
		e.b.left--
	}
	return nil
}

// failed records a transient failure of k's head and decides what next:
// retry with backoff, or give up per DeadPolicy once MaxAttempts or MaxAge
// is reached.
func (p *pipeline) failed(k *keyState, err error, now time.Time) error {
	k.attempts++
	k.lastErr = err
	p.r.m.retries.Inc()
	p.r.meter.fail(1, 0)
	if k.since.IsZero() {
		k.since = now
	}
	if err := p.recordAttempts(k, k.q[0].ev); err != nil {
		return err
	}
	age := now.Sub(k.since)
	cfg := &p.r.cfg
	if (cfg.MaxAttempts > 0 && k.attempts >= cfg.MaxAttempts) || (cfg.MaxAge > 0 && age >= cfg.MaxAge) {
		return p.giveUp(k, err, age)
	}
	level := slog.LevelDebug
	if k.attempts == 1 {
		level = slog.LevelWarn
	}
	p.r.log.Log(p.pubCtx, level, "ferry: publish failed; retrying this key with backoff (other keys go on)", "key", k.key, "event_id", k.q[0].ev.ID, "events", 1, "attempt", k.attempts, "err", err)
	k.retryAt = now.Add(p.r.retry.Delay(k.attempts))
	heap.Push(&p.backoff, k)
	return nil
}

// recordAttempts stores the failed attempts of a parked key's head with
// it, for the next leader.
func (p *pipeline) recordAttempts(k *keyState, head *ferryevent.Event) error {
	if !k.parked || p.parker == nil || head == nil || k.attempts == 0 || p.pubCtx.Err() != nil {
		// Publishing has ended (a stop past its ShutdownTimeout, a lost
		// lease): an abandoned call is no attempt worth a write.
		return nil
	}
	if err := p.parker.SetParkedAttempts(p.pubCtx, &ferrydriver.SetParkedAttemptsParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term,
		Key: k.key, EventID: head.ID, Attempts: k.attempts, FirstFailure: k.since}); err != nil {
		return p.storeErr("record the attempts of a parked key", err)
	}
	return nil
}

// giveUp applies the DeadPolicy to k's head.
func (p *pipeline) giveUp(k *keyState, err error, age time.Duration) error {
	e := k.q[0]
	reason := fmt.Sprintf("gave up after %d attempts over %v: %v", k.attempts, age.Round(time.Millisecond), err)
	if p.r.cfg.DeadPolicy == Hold && p.parkStuck {
		if !k.parked {
			if err := p.parkKey(k, reason); err != nil {
				return err
			}
		}
		if err := p.parker.HoldParked(p.pubCtx, &ferrydriver.HoldParkedParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term, Key: k.key, EventID: e.ev.ID, Reason: reason}); err != nil {
			return p.storeErr("hold a stuck key", err)
		}
		k.held = true
		p.r.m.heldKeys.Inc()
		p.r.log.ErrorContext(withEvent(p.pubCtx, e.ev), "ferry: key held: its event keeps failing; its later events wait (release it with `ferry parked release`)", "key", k.key, "event_id", e.ev.ID, "reason", reason)
		p.r.alert(p.pubCtx, &StuckKey{Feed: p.r.name, Key: k.key, Event: *e.ev, State: KeyHeld, Attempts: k.attempts, Since: k.since, Err: err})
		return nil
	}
	attempts, since := k.attempts, k.since
	dl := &ferrydriver.DeadLetter{Feed: p.r.name, Event: *e.ev, Reason: reason}
	if !k.parked {
		// Stored before the event counts as done for its batch; a parked
		// head is removed and dead-lettered in one write by finish.
		if err := p.deadLetter([]*ferrydriver.DeadLetter{dl}); err != nil {
			return err
		}
		dl = nil
	}
	if err := p.finish(k, e, dl); err != nil {
		return err
	}
	if dl != nil {
		p.r.m.deadLetters.Inc()
		p.r.meter.fail(0, 1)
	}
	p.r.alert(p.pubCtx, &StuckKey{Feed: p.r.name, Key: k.key, Event: *e.ev, State: KeyDeadLettered, Attempts: attempts, Since: since, Err: err})
	p.markReady(k)
	p.forget(k)
	return nil
}

// deadLetter stores dead letters, fenced.
func (p *pipeline) deadLetter(dead []*ferrydriver.DeadLetter) error {
	if err := p.r.store.InsertDeadLetters(p.pubCtx, &ferrydriver.InsertDeadLettersParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term, DeadLetters: dead}); err != nil {
		return p.storeErr(fmt.Sprintf("store %d dead letter(s)", len(dead)), err)
	}
	for _, d := range dead {
		p.r.log.WarnContext(withEvent(p.pubCtx, &d.Event), "ferry: event dead-lettered", "event_id", d.Event.ID, "key", d.Event.Key, "topic", d.Event.Topic, "reason", d.Reason)
	}
	p.r.m.deadLetters.Add(float64(len(dead)))
	p.r.meter.fail(0, int64(len(dead)))
	return nil
}

func (p *pipeline) storeErr(what string, err error) error {
	if errors.Is(err, ferrydriver.ErrLeaseLost) {
		return err
	}
	if p.pubCtx.Err() != nil {
		return context.Cause(p.pubCtx)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// forget drops the state of a key with nothing left to do.
func (p *pipeline) forget(k *keyState) {
	if len(k.q) == 0 && k.busy == 0 && !k.parked && !k.inReady && k.heapIdx < 0 {
		delete(p.keys, k.key)
	}
}

// advance hands the cursor of every leading batch that is done to the
// checkpointer.
func (p *pipeline) advance() {
	var cursor []byte
	events := 0
	now := time.Now()
	for len(p.batches) > 0 && p.batches[0].left == 0 {
		b := p.batches[0]
		p.batches[0] = nil
		p.batches = p.batches[1:]
		p.behind -= b.size
		cursor = b.cursor
		events += b.size + b.invalid
		if b.size+b.invalid > 0 {
			p.r.progress.Add(1)
			p.r.m.publishSeconds.Observe(now.Sub(b.read).Seconds())
			p.r.m.lagSeconds.Set(max(0, now.Sub(b.oldest).Seconds()))
		}
	}
	if cursor != nil {
		p.ck.offer(cursor, events)
	}
	p.r.health.delivered(p.behind, events > 0, now)
}

// reportStuck records, every heartbeat, the key whose head has waited
// longest for an acknowledgement (Health, ferry_relay_stuck_key_seconds).
func (p *pipeline) reportStuck(now time.Time) {
	var key string
	var oldest time.Time
	for _, k := range p.keys {
		if len(k.q) == 0 {
			continue
		}
		since := k.since
		if !k.parkedAt.IsZero() && (since.IsZero() || k.parkedAt.Before(since)) {
			since = k.parkedAt
		}
		if !since.IsZero() && (oldest.IsZero() || since.Before(oldest)) {
			key, oldest = k.key, since
		}
	}
	p.r.health.stuck(key, oldest, now)
	age := time.Duration(0)
	if !oldest.IsZero() {
		age = max(0, now.Sub(oldest))
	}
	p.r.m.stuckKeySeconds.Set(age.Seconds())
}

// park sets aside the events of keys that hold the pipeline back: a key
// whose head has gone unacknowledged for StallTimeout while the sink
// acknowledged other events meanwhile (a destination that is down for
// everyone is an outage, not a stuck key: nothing would flow anyway), or,
// when the window is full, for a tenth of that.
func (p *pipeline) park() error {
	if !p.parkStuck || len(p.keys) == 0 {
		return nil
	}
	stall := p.r.cfg.StallTimeout
	if !p.canRead() {
		stall /= 10
	}
	now := time.Now()
	// The scan visits every key with work: at most a few times per stall.
	if now.Sub(p.lastScan) < stall/4 {
		return nil
	}
	p.lastScan = now
	var stuck []*keyState
	for _, k := range p.keys {
		if k.parked || len(k.q) == 0 || k.since.IsZero() {
			continue
		}
		if now.Sub(k.since) < stall || !p.lastAck.After(k.since) {
			continue
		}
		stuck = append(stuck, k)
		if len(stuck) >= 100 {
			break
		}
	}
	for _, k := range stuck {
		reason := "not acknowledged within StallTimeout"
		if k.lastErr != nil {
			reason = k.lastErr.Error()
		}
		if err := p.parkKey(k, reason); err != nil {
			return err
		}
	}
	return nil
}

// parkKey moves k's queue to the store, because its destination does
// not acknowledge it (reason: the last error).
func (p *pipeline) parkKey(k *keyState, reason string) error {
	events, err := p.setAside(k, reason)
	if err != nil {
		return err
	}
	if len(events) > 0 {
		// Its head's failures so far: the head may be loaded back from
		// the store (loadHeads), with what is recorded there.
		if err := p.recordAttempts(k, events[0]); err != nil {
			return err
		}
	}
	p.r.m.parkedKeys.Inc()
	p.r.log.Warn("ferry: key parked: its destination does not acknowledge it; its events are set aside and published in order once it recovers (other keys go on)",
		"key", k.key, "events", len(events), "since", k.since, "attempts", k.attempts, "reason", reason)
	if len(events) > 0 {
		p.r.alert(p.pubCtx, &StuckKey{Feed: p.r.name, Key: k.key, Event: *events[0], State: KeyParked, Attempts: k.attempts, Since: k.since, Err: k.lastErr})
	}
	p.advance()
	return nil
}

// setAside moves k's queue to the store, behind what the store already
// holds for the key, and marks k parked. The events in flight stay at the
// head of the queue (an ordered sink takes several of a key in one call):
// their outcomes still count, and the key's next event waits for them.
func (p *pipeline) setAside(k *keyState, reason string) ([]*ferryevent.Event, error) {
	events := make([]*ferryevent.Event, len(k.q))
	for i, e := range k.q {
		events[i] = e.ev
	}
	if err := p.parker.ParkEvents(p.pubCtx, &ferrydriver.ParkEventsParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term, Events: events, Reason: reason}); err != nil {
		return nil, p.storeErr("park a key's events", err)
	}
	keep := min(k.busy, len(k.q))
	if k.busy == 0 {
		keep = 0
		if k.inReady {
			// its head is loaded again from the store
			k.inReady = false
			for i, r := range p.ready {
				if r == k {
					p.ready = append(p.ready[:i], p.ready[i+1:]...)
					break
				}
			}
		}
		p.needHeads[k] = true
	}
	for _, e := range k.q {
		if e.b != nil {
			e.b.left--
			e.b = nil
		}
	}
	for i := keep; i < len(k.q); i++ {
		k.q[i] = nil
	}
	k.q = k.q[:keep]
	k.parked = true
	p.r.m.parkedEvents.Add(float64(len(events)))
	return events, nil
}

// adoptRedriven takes up, every heartbeat, the keys whose parked queue
// in this feed holds events an operator redrove (RedriveDeadLetters puts
// them there, for this feed only): from then on such a key is published
// from its queue, in order. A key the pipeline has events of goes into
// the store behind the redriven ones (those in flight stay first); its
// next event is then the queue's head. A redriven event is so published
// after the events of its key already handed to the destination, before
// the rest.
func (p *pipeline) adoptRedriven() error {
	if p.parker == nil {
		return nil
	}
	heads, err := p.parker.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Redriven: true, Limit: 1000})
	if err != nil {
		return p.storeErr("read redriven events", err)
	}
	adopted := 0
	for _, h := range heads {
		k := p.keys[h.Event.Key]
		if k != nil && k.parked {
			continue // its queue is being published: the redriven events come in turn
		}
		adopted++
		p.r.m.parkedKeys.Inc()
		if k == nil {
			k = &keyState{key: h.Event.Key, heapIdx: -1, parked: true}
			p.keys[k.key] = k
			k.headFrom(h)
			p.markReady(k)
			continue
		}
		if _, err := p.setAside(k, "behind events redriven by an operator"); err != nil {
			return err
		}
		if k.busy == 0 {
			// Its head is now the queue's: the failures of the one before
			// do not count against it.
			if k.heapIdx >= 0 {
				heap.Remove(&p.backoff, k.heapIdx)
			}
			k.fresh()
		}
	}
	if adopted > 0 {
		p.r.log.Info("ferry: publishing redriven dead letters: their keys go from their parked queues, the redriven events first", "keys", adopted)
		p.advance()
	}
	return nil
}

// defaultParkedLoadCap bounds the parked keys a leadership loads at once.
const defaultParkedLoadCap = 100000

func (p *pipeline) parkedLoadCap() int {
	if p.r.parkedLoadCap > 0 {
		return p.r.parkedLoadCap
	}
	return defaultParkedLoadCap
}

// loadParked picks up the keys a previous leader parked, and those with
// redriven dead letters, at most the load cap of them. With more in the
// store, the rest are picked up by later scans (rescanParked) and, when
// their keys have new events, by lookUpParked.
func (p *pipeline) loadParked() error {
	if p.parker == nil {
		return nil
	}
	heads, err := p.parker.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Limit: p.parkedLoadCap()})
	if err != nil {
		return p.storeErr("read parked keys", err)
	}
	p.parkedBeyond = len(heads) >= p.parkedLoadCap()
	n := p.adoptParked(heads)
	if n > 0 {
		p.r.log.Info("ferry: resuming parked keys", "keys", n, "more_in_store", p.parkedBeyond)
	}
	return nil
}

// adoptParked takes up the parked heads of keys the pipeline does not
// know, and returns how many it took.
func (p *pipeline) adoptParked(heads []*ferrydriver.ParkedEvent) int {
	n := 0
	for _, h := range heads {
		if p.keys[h.Event.Key] != nil {
			continue
		}
		k := &keyState{key: h.Event.Key, heapIdx: -1, parked: true, held: h.Held, parkedAt: h.ParkedAt}
		p.keys[k.key] = k
		k.headFrom(h)
		p.r.m.parkedKeys.Inc()
		if k.held {
			p.r.m.heldKeys.Inc()
		}
		p.markReady(k)
		n++
	}
	return n
}

// lookUpParked, while parked keys are left in the store unloaded, takes up
// those among the keys of events that the pipeline does not know: their
// new events then join their parked queues instead of going first.
func (p *pipeline) lookUpParked(events []*ferryevent.Event) error {
	if !p.parkedBeyond || len(events) == 0 {
		return nil
	}
	var unknown []string
	seen := map[string]bool{}
	for _, ev := range events {
		if p.keys[ev.Key] == nil && !seen[ev.Key] {
			seen[ev.Key] = true
			unknown = append(unknown, ev.Key)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	heads, err := p.parker.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Keys: unknown})
	if err != nil {
		return p.storeErr("look up parked keys", err)
	}
	p.adoptParked(heads)
	return nil
}

// rescanParked, every heartbeat while parked keys are left in the store
// unloaded, loads more of them once fewer than half the cap are loaded;
// a scan that finds fewer than the cap has loaded them all.
func (p *pipeline) rescanParked() error {
	if !p.parkedBeyond {
		return nil
	}
	loaded := 0
	for _, k := range p.keys {
		if k.parked {
			loaded++
		}
	}
	if loaded >= p.parkedLoadCap()/2 {
		return nil
	}
	heads, err := p.parker.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Limit: p.parkedLoadCap()})
	if err != nil {
		return p.storeErr("read parked keys", err)
	}
	p.parkedBeyond = len(heads) >= p.parkedLoadCap()
	if n := p.adoptParked(heads); n > 0 {
		p.r.log.Info("ferry: resuming more parked keys", "keys", n, "more_in_store", p.parkedBeyond)
	}
	return nil
}

// loadHeads reads the next event of parked keys whose head was published;
// a key with nothing left is unparked (its later events were all parked by
// this pipeline, so none can be on their way).
func (p *pipeline) loadHeads() error {
	if len(p.needHeads) == 0 {
		return nil
	}
	keys := make([]string, 0, len(p.needHeads))
	for k := range p.needHeads {
		if k.busy == 0 && len(k.q) == 0 {
			keys = append(keys, k.key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	heads, err := p.parker.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Keys: keys})
	if err != nil {
		return p.storeErr("read parked events", err)
	}
	found := make(map[string]*ferrydriver.ParkedEvent, len(heads))
	for _, h := range heads {
		found[h.Event.Key] = h
	}
	for _, key := range keys {
		k := p.keys[key]
		delete(p.needHeads, k)
		h := found[key]
		if h == nil {
			k.parked = false
			if k.held {
				k.held = false
				p.r.m.heldKeys.Dec()
			}
			p.r.m.parkedKeys.Dec()
			p.r.log.Info("ferry: key unparked: its parked events are published", "key", key)
			p.forget(k)
			continue
		}
		k.headFrom(h)
		p.markReady(k)
	}
	return nil
}

// checkHeld looks, every heartbeat, for held keys an operator released.
func (p *pipeline) checkHeld() error {
	if p.parker == nil {
		return nil
	}
	var keys []string
	for _, k := range p.keys {
		if k.held {
			keys = append(keys, k.key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	heads, err := p.parker.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Keys: keys})
	if err != nil {
		return p.storeErr("read held keys", err)
	}
	byKey := make(map[string]*ferrydriver.ParkedEvent, len(heads))
	for _, h := range heads {
		byKey[h.Event.Key] = h
	}
	for _, key := range keys {
		k := p.keys[key]
		h := byKey[key]
		if h != nil && h.Held && len(k.q) > 0 && h.Event.ID == k.q[0].ev.ID {
			continue // still held
		}
		k.held = false
		p.r.m.heldKeys.Dec()
		k.fresh()
		p.r.log.Info("ferry: held key released", "key", key)
		k.q = k.q[:0]
		if h != nil {
			k.headFrom(h)
			p.markReady(k)
		} else {
			p.needHeads[k] = true
		}
	}
	return nil
}

// keyHeap orders keys in backoff by retry time.
type keyHeap []*keyState

func (h keyHeap) Len() int           { return len(h) }
func (h keyHeap) Less(i, j int) bool { return h[i].retryAt.Before(h[j].retryAt) }
func (h keyHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *keyHeap) Push(x any) {
	k := x.(*keyState)
	k.heapIdx = len(*h)
	*h = append(*h, k)
}
func (h *keyHeap) Pop() any {
	old := *h
	k := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	k.heapIdx = -1
	return k
}
