package ferry

import (
	"container/heap"
	"context"
	"fmt"
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
// hangs or keeps failing) only waits itself; its events are set aside in
// the store ("parked"), so that the checkpoint and the read-ahead move on, and are published from
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
	// parkStuck: stuck keys are parked (not RelayConfig.DisableParking);
	// without it the store's parked events are the keys of redriven dead
	// letters only.
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
	cursor []byte
	// n and seqs: the batch's number and the Seqs the relay gave in it
	// (readResult), saved with its cursor.
	n       uint64
	seqs    map[string]int64
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
	p.parkStuck = !r.cfg.DisableParking
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
	heartbeat := time.NewTicker(p.r.cfg.HeartbeatInterval)
	defer heartbeat.Stop()
	end, err := p.deliver(stop, reads, heartbeat.C)
	if err != nil {
		return err
	}
	return p.drain(end, heartbeat.C)
}

// deliver reads, publishes and settles until stop ends (it returns a nil
// end) or the feed's read does (it returns that read's result), or an
// error ends the leadership.
func (p *pipeline) deliver(stop context.Context, reads <-chan readResult, heartbeat <-chan time.Time) (end *readResult, err error) {
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	lingering, lingered := false, false
	var wake *time.Timer
	for {
		if err := p.pubCtx.Err(); err != nil {
			return nil, context.Cause(p.pubCtx)
		}
		var readCh <-chan readResult
		var saved <-chan struct{}
		// The channel is taken before the second look, so that a save
		// completing in between still wakes the loop.
		progressed := p.ck.progressed()
		if p.canRead() {
			readCh = reads
		} else if p.ck.unsaved() > 0 {
			saved = progressed
		}
		var wakeC <-chan time.Time
		if next, ok := p.nextWake(); ok {
			if wake == nil {
				wake = time.NewTimer(time.Until(next))
			} else {
				wake.Reset(time.Until(next))
			}
			wakeC = wake.C
		}
		select {
		case res := <-readCh:
			if res.batch == nil {
				return &res, nil
			}
			if err := p.add(&res); err != nil {
				return nil, err
			}
		case <-p.outcomes.signal:
			if err := p.settle(p.outcomes.take()); err != nil {
				return nil, err
			}
		case <-saved:
		case <-wakeC:
		case <-linger.C:
			lingering, lingered = false, true
		case <-heartbeat:
			if err := p.beat(); err != nil {
				return nil, err
			}
		case <-stop.Done():
			return nil, nil
		case <-p.pubCtx.Done():
			return nil, context.Cause(p.pubCtx)
		}
		if wake != nil {
			wake.Stop()
		}
		if err := p.park(); err != nil {
			return nil, err
		}
		if err := p.loadHeads(); err != nil {
			return nil, err
		}
		p.releaseBackoff(time.Now())
		p.send(linger, &lingering, &lingered)
		p.advance()
	}
}

// drain lets the calls in flight finish, reading and sending nothing more:
// until pubCtx ends (the shutdown timeout), or, after a read that ended
// (end), for StallTimeout at most, so that the checkpoint saved before the
// feed is reopened covers what was acknowledged. It returns end's error.
func (p *pipeline) drain(end *readResult, heartbeat <-chan time.Time) error {
	var readErr error
	var stalled <-chan time.Time
	if end != nil {
		readErr = end.err
		t := time.NewTimer(p.r.cfg.StallTimeout)
		defer t.Stop()
		stalled = t.C
	}
	for p.inFlight > 0 {
		select {
		case <-p.outcomes.signal:
			if err := p.settle(p.outcomes.take()); err != nil {
				return err
			}
		case <-heartbeat:
			if err := p.beat(); err != nil {
				return err
			}
		case <-stalled:
			return readErr
		case <-p.pubCtx.Done():
			// The shutdown timeout is up: what is still in flight is
			// abandoned (its calls report it as failed).
			if err := p.settle(p.outcomes.take()); err != nil {
				return err
			}
			if p.inFlight > 0 {
				p.r.log.Warn("ferry: stopping with events still unacknowledged; the next leader publishes them again", "events", p.inFlight)
			}
			return readErr
		}
	}
	return readErr
}

// beat is the pipeline's periodic work: stuck keys and duplicates
// reported, held keys checked, redriven dead letters adopted, parked keys
// rescanned.
func (p *pipeline) beat() error {
	p.reportStuck(time.Now())
	p.r.reportDuplicates(false)
	if err := p.checkHeld(); err != nil {
		return err
	}
	if err := p.adoptRedriven(); err != nil {
		return err
	}
	return p.rescanParked()
}

// send dispatches the events ready. While other calls are in flight, a
// small call waits a moment for company (linger), once.
func (p *pipeline) send(linger *time.Timer, lingering, lingered *bool) {
	if len(p.ready) == 0 {
		return
	}
	if p.calls == 0 || len(p.ready) >= p.minCall() || *lingered {
		p.dispatch()
		*lingered = false
	} else if !*lingering {
		linger.Reset(time.Millisecond)
		*lingering = true
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
func (p *pipeline) add(res *readResult) error {
	b := res.batch
	bs := &batchState{cursor: b.Cursor, n: res.n, seqs: res.seqs, size: len(b.Events), invalid: len(b.Invalid), read: time.Now()}
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
		if err := p.r.store.ParkEvents(p.pubCtx, &ferrydriver.ParkEventsParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term, Events: toPark}); err != nil {
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

// advance hands the cursor of every leading batch that is done to the
// checkpointer.
func (p *pipeline) advance() {
	var cursor []byte
	var n uint64
	var seqs map[string]int64
	events := 0
	now := time.Now()
	for len(p.batches) > 0 && p.batches[0].left == 0 {
		b := p.batches[0]
		p.batches[0] = nil
		p.batches = p.batches[1:]
		p.behind -= b.size
		cursor, n = b.cursor, max(n, b.n)
		keepSeqs(&seqs, b.seqs)
		events += b.size + b.invalid
		if b.size+b.invalid > 0 {
			p.r.progress.Add(1)
			p.r.m.publishSeconds.Observe(now.Sub(b.read).Seconds())
			p.r.m.lagSeconds.Set(max(0, now.Sub(b.oldest).Seconds()))
		}
	}
	if cursor != nil {
		p.ck.offer(cursor, events, n, seqs)
	}
	p.r.health.delivered(p.behind, events > 0, now)
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
