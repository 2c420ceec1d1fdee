// One term of a relay's leadership, step by step: keep the lease, open the
// feed where the checkpoint says, publish until the lease is lost, the feed
// fails or the relay stops, then save the last cursor and hand the lease
// over.

package ferry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// lead runs one term of leadership. asked is when the lease was requested:
// the local trust window is measured from then, before the database set
// the expiry, so it always ends before the lease does.
func (r *Relay) lead(stop context.Context, lease *ferrydriver.Lease, asked time.Time) error {
	l := &leadership{r: r, stop: stop, lease: lease}
	defer l.close()
	l.keepLease(asked)
	l.startShutdownClock()
	feed, cursor, err := l.openFeed()
	if err != nil {
		return err
	}
	l.startCheckpointer(cursor)
	reads := l.startReading(feed)
	readErr, err := l.publish(reads)
	if err != nil {
		return err
	}
	return l.handOver(readErr)
}

// leadership is one term's state. Each step registers what undoes it
// (undo); close runs them in reverse when the term ends.
type leadership struct {
	r     *Relay
	stop  context.Context // the relay's stop: ends reading, starts the shutdown clock
	lease *ferrydriver.Lease
	undo  []func()

	// trust is the end of the lease's local trust window: no event is
	// handed to the sink after it (keepLease ends the leadership then).
	trust *trustWindow
	// leaseCtx ends when the lease is lost (or the term ends), not when
	// stop ends: a stopping relay still finishes its batch in flight.
	leaseCtx  context.Context
	loseLease func(cause error)
	wg        sync.WaitGroup // the lease keeper and the maintenance

	sd     *shutdown
	pubCtx context.Context // publishing; ends at the shutdown's deadline

	ck       *checkpointer
	stopCk   func() // stops the checkpointer and waits for it
	stopRead func() // stops reading ahead and waits for the reader
}

func (l *leadership) onClose(f func()) { l.undo = append(l.undo, f) }

// close undoes the steps taken, last first.
func (l *leadership) close() {
	for i := len(l.undo) - 1; i >= 0; i-- {
		l.undo[i]()
	}
}

// keepLease reports the leadership and renews the lease in the
// background; losing it (or the term's end) ends the trust window at once
// and cancels leaseCtx.
func (l *leadership) keepLease(asked time.Time) {
	r := l.r
	r.m.leader.Set(1)
	r.health.leading(true, time.Now())
	l.onClose(func() {
		r.health.leading(false, time.Now())
		r.m.stuckKeySeconds.Set(0)
	})
	// A standby reads no lag: its samples must not carry the last one it
	// read while it led.
	l.onClose(func() { r.meter.lagged(0, 0) })
	l.trust = new(trustWindow)
	l.trust.set(asked.Add(l.lease.ExpiresAt.Sub(l.lease.Now) - leaseMargin(r.cfg.LeaseTTL)))
	leaseCtx, cancelLease := context.WithCancelCause(context.WithoutCancel(l.stop))
	l.leaseCtx = leaseCtx
	// A sink call abandoned earlier (its sink ignored its context) must
	// not pass its fence after the lease was lost or released, while a
	// standby may lead: the trust window ends first.
	l.loseLease = func(cause error) {
		l.trust.end()
		cancelLease(cause)
	}
	l.onClose(func() {
		l.loseLease(nil)
		l.wg.Wait()
	})
	l.wg.Go(func() { r.keepLease(leaseCtx, l.lease, l.loseLease, asked, l.trust) })
}

// startShutdownClock makes publishing end (pubCtx) once stop has ended
// and the relay's ShutdownTimeout, less the reserve for the final
// checkpoint and the lease's release, has passed, whether or not the sink
// honours its context.
func (l *leadership) startShutdownClock() {
	r := l.r
	l.sd = newShutdown(r.cfg.ShutdownTimeout)
	pubCtx, endPublishing := context.WithCancelCause(l.leaseCtx)
	l.pubCtx = pubCtx
	l.onClose(func() { endPublishing(nil) })
	stopClock := context.AfterFunc(l.stop, func() {
		time.AfterFunc(time.Until(l.sd.begin().Add(r.cfg.ShutdownTimeout-l.sd.reserve)), func() { endPublishing(errShutdownTimeout) })
	})
	l.onClose(func() { stopClock() })
}

// openFeed loads the checkpoint and opens the feed there. It gives up when
// stop ends too: a relay stopped while it starts leading does not wait for
// its store.
func (l *leadership) openFeed() (ferrydriver.Feed, []byte, error) {
	r := l.r
	startCtx, cancelStart := context.WithCancel(l.leaseCtx)
	l.onClose(cancelStart)
	stopStart := context.AfterFunc(l.stop, cancelStart)
	l.onClose(func() { stopStart() })
	cp, err := r.store.LoadCheckpoint(startCtx, r.name)
	if err != nil {
		return nil, nil, err
	}
	feed, err := r.store.OpenFeed(startCtx, &ferrydriver.OpenFeedParams{Feed: r.name, Partition: r.cfg.Partition, Cursor: cp.Cursor})
	if err != nil {
		return nil, nil, err
	}
	l.onClose(func() { feed.Close() })
	return feed, cp.Cursor, nil
}

// startCheckpointer saves the cursor as batches are delivered, and runs
// the upkeep (retention, lag) while the lease is held.
func (l *leadership) startCheckpointer(cursor []byte) {
	r := l.r
	l.ck = newCheckpointer(r, l.lease.Term, cursor, l.loseLease)
	ckCtx, cancelCk := context.WithCancel(l.leaseCtx)
	ckDone := make(chan struct{})
	go func() { defer close(ckDone); l.ck.run(ckCtx) }()
	l.stopCk = func() { cancelCk(); <-ckDone }
	l.onClose(l.stopCk)
	l.wg.Go(func() { r.maintain(l.leaseCtx, l.ck) })
}

// startReading reads the next batch while the current one is published,
// until stop ends: no new batch is started after it.
func (l *leadership) startReading(feed ferrydriver.Feed) <-chan readResult {
	readCtx, cancelRead := context.WithCancel(l.leaseCtx)
	l.onClose(cancelRead)
	stopRead := context.AfterFunc(l.stop, cancelRead)
	l.onClose(func() { stopRead() })
	reads := make(chan readResult, 1)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		l.r.readAhead(readCtx, feed, l.r.keySeqs(&l.ck.savedBatch), reads)
	}()
	l.stopRead = func() { cancelRead(); <-readerDone }
	l.onClose(l.stopRead)
	return reads
}

// publish delivers what is read until the lease is lost, the feed fails,
// or the relay stops. A lost lease ends the term (err); a feed's failure
// is returned as readErr, for handOver to save what was delivered before
// the term ends.
func (l *leadership) publish(reads <-chan readResult) (readErr, err error) {
	r := l.r
	perr := newPipeline(r, l.lease.Term, l.pubCtx, l.ck, l.trust).run(l.stop, reads)
	switch {
	case perr == nil:
		return nil, nil
	case l.leaseCtx.Err() != nil:
		return nil, context.Cause(l.leaseCtx)
	case errors.Is(perr, ferrydriver.ErrLeaseLost):
		l.loseLease(perr)
		return nil, perr
	case l.stop.Err() == nil:
		// Save what was delivered before giving the feed up: the next
		// leadership then redelivers nothing of it.
		return fmt.Errorf("feed %s: %w", r.name, perr), nil
	}
	return nil, nil
}

// handOver stops reading, saves the last cursor and releases the lease at
// once: for a stopping relay, so that a standby takes over; after a feed's
// failure (readErr), so that the next leadership, this Run's or a
// standby's, has a new term. A save of this term that its caller gave up
// on (the checkpointer is cancelled, the flush has a deadline) may still
// commit on the server; the new term's fence refuses it, or the lease's
// release waits for it, so the next leadership never loads a checkpoint
// older than the key numbers it then reads (keySeqs).
func (l *leadership) handOver(readErr error) error {
	r := l.r
	l.stopRead()
	l.stopCk()
	deadline := time.Now().Add(r.cfg.ShutdownTimeout)
	if l.stop.Err() != nil {
		deadline = l.sd.begin().Add(r.cfg.ShutdownTimeout)
	}
	l.ck.flush(l.stop, time.Until(deadline.Add(-l.sd.reserve/2)))
	relCtx, cancel := context.WithDeadline(context.WithoutCancel(l.stop), deadline)
	defer cancel()
	l.loseLease(errStopping)
	if err := r.store.ReleaseLease(relCtx, &ferrydriver.LeaseParams{Name: r.name, Holder: r.holder, Term: l.lease.Term}); err != nil {
		r.log.Warn("ferry: could not release the lease; a standby takes over when it expires", "err", err)
	}
	return readErr
}
