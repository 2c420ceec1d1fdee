// What the relay does with the sink's answers: events delivered are
// checkpointed, failures retried with backoff, and events given up on
// dead-lettered.

package ferry

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

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
		if err := p.r.store.UnparkEvent(p.pubCtx, &ferrydriver.UnparkEventParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term, Key: k.key, EventID: e.ev.ID, DeadLetter: dl}); err != nil {
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
	if !k.parked || head == nil || k.attempts == 0 || p.pubCtx.Err() != nil {
		// Publishing has ended (a stop past its ShutdownTimeout, a lost
		// lease): an abandoned call is no attempt worth a write.
		return nil
	}
	if err := p.r.store.SetParkedAttempts(p.pubCtx, &ferrydriver.SetParkedAttemptsParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term,
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
		if err := p.r.store.HoldParked(p.pubCtx, &ferrydriver.HoldParkedParams{Feed: p.r.name, Holder: p.r.holder, Term: p.term, Key: k.key, EventID: e.ev.ID, Reason: reason}); err != nil {
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
