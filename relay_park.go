// Keys the relay sets aside: parked while their destination fails (and
// published from the database once it answers), held under the hold
// dead policy, redriven dead letters adopted back into their key's order.

package ferry

import (
	"container/heap"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

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
	if err := p.r.store.ParkEvents(p.pubCtx, &ferrydriver.ParkEventsParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term, Events: events, Reason: reason}); err != nil {
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
	heads, err := p.r.store.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Redriven: true, Limit: 1000})
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
	heads, err := p.r.store.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Limit: p.parkedLoadCap()})
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
	heads, err := p.r.store.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Keys: unknown})
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
	heads, err := p.r.store.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Limit: p.parkedLoadCap()})
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
	heads, err := p.r.store.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Keys: keys})
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
	var keys []string
	for _, k := range p.keys {
		if k.held {
			keys = append(keys, k.key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	heads, err := p.r.store.ParkedHeads(p.pubCtx, &ferrydriver.ParkedHeadsParams{Feed: p.r.name, Keys: keys})
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
