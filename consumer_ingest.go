// Events claimed as they are ingested: a consumer whose inbox can claim in
// the statement that records deliveries (ferrydriver.InboxIngestClaimer)
// starts them on its workers at once, without a claim of its own.

package ferry

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// liveRun is what a running Run lends Ingest: its handlers' context, its
// worker slots and its handlers' WaitGroup; slots is nil when no Run runs.
// Ingest holds the read lock from the free slots' count to the handlers'
// start, so that Run stops lending (end) only once no Ingest can start a
// handler any more, before it waits for them.
type liveRun struct {
	mu       sync.RWMutex
	work     context.Context
	slots    chan struct{}
	handlers *sync.WaitGroup
	// waiting counts the units Ingest started that wait for a slot.
	waiting atomic.Int64
}

func (l *liveRun) lend(work context.Context, slots chan struct{}, handlers *sync.WaitGroup) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.work, l.slots, l.handlers = work, slots, handlers
}

func (l *liveRun) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.work, l.slots, l.handlers = nil, nil, nil
}

// freeWorkers is how many of Run's workers (their slots) are free: the
// runs Ingest started that wait for a slot count as taken.
func (c *Consumer[TTx]) freeWorkers(slots chan struct{}) int {
	return max(0, c.cfg.Workers-len(slots)-int(c.live.waiting.Load()))
}

// runLength is the most events of one key that a claim takes at once.
func (c *Consumer[TTx]) runLength() int {
	switch {
	case c.batcher == nil:
		return maxRun // one event per transaction, the run's in order
	case len(c.batched) > 0:
		// A batch handler gets a round's events (one per key) in one
		// call: short runs of many keys make few calls.
		return batchHandlerRun(c.cfg.BatchSize)
	default:
		return c.cfg.BatchSize // runs of a key's events, up to a batch each
	}
}

// insert records events in the inbox. While Run runs (and is not running
// rescued events, which run alone) and a worker is free, it has the
// statement claim the new rows of keys that had nothing to do, up to a
// key per worker, and starts them; it returns InsertInbox's result and
// how many rows it claimed. The units beyond the free workers wait for
// one (claiming only the free workers' worth, the rest of a delivery
// waited for the claim loop instead, and the whole took longer: issue 36's
// notes); none are claimed while those wait.
func (c *Consumer[TTx]) insert(ctx context.Context, events []*Event) ([]bool, int, error) {
	p := &ferrydriver.InsertInboxParams{Group: c.cfg.Group, Events: events}
	if c.claimer == nil {
		res, err := c.driver.InsertInbox(ctx, p)
		return res, 0, err
	}
	c.live.mu.RLock()
	defer c.live.mu.RUnlock()
	if c.live.slots == nil || c.rescuing.Load() || c.freeWorkers(c.live.slots) == 0 {
		res, err := c.driver.InsertInbox(ctx, p)
		return res, 0, err
	}
	// As a claim's: counted from before the statement, less a margin.
	deadline := time.Now().Add(c.cfg.ClaimTTL - c.cfg.ClaimTTL/10)
	// A source that stops (ctx ends) while the statement commits must not
	// leave what it claimed unrun. (A connection lost after the commit
	// does: those rows are rescued at the claim's expiry, as a crashed
	// worker's are.)
	cctx, cancel := c.claimContext(ctx)
	defer cancel()
	res, rows, err := c.claimer.InsertInboxClaim(cctx, p, &ferrydriver.IngestClaimParams{Worker: c.worker, TTL: c.cfg.ClaimTTL, Keys: c.cfg.Workers, PerKey: c.runLength()})
	if err != nil || len(rows) == 0 {
		return res, 0, err
	}
	handed := time.Now()
	units := runsOf(rows) // a worker per key's run
	if c.batcher != nil {
		units = batches(rows, c.costs.spread(rows, c.cfg.Workers), c.cfg.BatchSize)
	}
	// Each unit waits for its worker slot in its own goroutine: the
	// delivery's source goes on at once (it acknowledges the delivery
	// next).
	work, slots := c.live.work, c.live.slots // end clears them
	c.live.waiting.Add(int64(len(units)))
	for _, unit := range units {
		c.live.handlers.Go(func() {
			slots <- struct{}{}
			c.live.waiting.Add(-1)
			c.processUnit(work, unit, slots, deadline, handed)
		})
	}
	// What the statement claimed of these events: a run may also take a
	// later event of the key that another delivery committed.
	mine := make(map[uuid.UUID]bool, len(events))
	for i, ev := range events {
		mine[ev.ID] = res[i]
	}
	n := 0
	for _, r := range rows {
		if mine[r.Event.ID] {
			n++
		}
	}
	return res, n, nil
}

// start runs units of claimed rows under work, each on a worker slot as
// one is free (start waits for it).
func (c *Consumer[TTx]) start(work context.Context, units [][]*ferrydriver.InboxRow, slots chan struct{}, handlers *sync.WaitGroup, deadline time.Time) {
	handed := time.Now()
	for _, unit := range units {
		slots <- struct{}{}
		handlers.Go(func() { c.processUnit(work, unit, slots, deadline, handed) })
	}
}

// processUnit runs a unit on the worker slot it holds, then frees the slot
// and wakes the claim loop: a batch in one transaction, a run of one key's
// rows a transaction each, by deadline. A unit that got its slot longer
// than a batch's budget after its claim handed it over (the handlers
// ahead of it ran long; an ingest claims a key per worker, busy or not)
// is given back, not counted: what is left of its claim's time could fail
// it, charged an attempt.
func (c *Consumer[TTx]) processUnit(work context.Context, unit []*ferrydriver.InboxRow, slots chan struct{}, deadline, handed time.Time) {
	defer func() { <-slots; c.Notify() }()
	if time.Since(handed) > batchBudget(c.cfg.ClaimTTL) {
		c.giveBackRows(work, unit, "it waited for a worker past its time budget", handed)
		return
	}
	if c.batcher != nil && len(unit) > 1 {
		c.processBatch(work, c.batcher, unit, deadline)
	} else {
		c.processRun(work, unit, deadline)
	}
}
