// One transaction's run of a batch: its handler calls, round by round,
// what became of each event, and what happens when it rolls back.

package ferry

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
)

// batch is one transaction's run of a batch's handlers (an attempt of
// RunInTx, which may run it again), and what became of each event.
type batch[TTx any] struct {
	c      *Consumer[TTx]
	b      ferrydriver.InboxBatcher[TTx]
	rows   []*ferrydriver.InboxRow
	sp     *savepointRun // nil: no savepoints, the first failure rolls back
	budget time.Duration // past it, the rest is given back

	out []batchOutcome
	// running is the events whose handler call runs; nil: none (the end).
	running []int
	// late is the events left out: the batch ran out of time first, or an
	// earlier event of their key did not finish.
	late []int

	// Per attempt:
	ctx     context.Context
	tx      TTx
	txStart time.Time
	// firstRecorded: a run with savepoints does not stop for its budget
	// before it has recorded the failure that made it (the run without
	// them reached that event within its budget; the claims' deadline
	// still bounds).
	firstRecorded bool
	stopped       map[string]bool // keys whose event did not finish: their later events wait
	fin           *ferrydriver.FinishInboxParams
	// calls is the handler calls' times (txCosts); attempts counts the
	// transaction's attempts.
	calls    []handlerTime
	attempts int
}

// attempt runs the batch in tx and records every outcome in it.
func (bt *batch[TTx]) attempt(ctx context.Context, tx TTx) error {
	bt.ctx, bt.tx, bt.txStart = ctx, tx, time.Now()
	bt.late = bt.late[:0]
	bt.firstRecorded = bt.sp.charged() == nil
	bt.stopped = map[string]bool{}
	bt.fin = &ferrydriver.FinishInboxParams{Group: bt.c.cfg.Group, Rows: make([]ferrydriver.FinishedRow, 0, len(bt.rows))}
	bt.calls = bt.calls[:0]
	bt.attempts++
	if err := bt.runRounds(); err != nil {
		return err
	}
	bt.running = nil
	bt.giveBackLate()
	lost, err := bt.b.FinishInboxTx(ctx, tx, bt.fin)
	if err != nil {
		return err
	}
	if len(lost) > 0 {
		e := &errBatchClaimLost{lost: make(map[uuid.UUID]bool, len(lost))}
		for _, id := range lost {
			e.lost[id] = true
		}
		return e
	}
	return nil
}

// runRounds calls the handlers round by round (a key's n-th events in
// round n), skipping a key's events after one that did not finish, until
// the budget is spent; a non-nil error means the transaction cannot go
// on.
func (bt *batch[TTx]) runRounds() error {
	rounds := roundsOf(bt.rows)
	for r, round := range rounds {
		var todo []int
		for _, i := range round {
			if bt.stopped[bt.rows[i].Event.Key] {
				bt.late = append(bt.late, i)
			} else {
				todo = append(todo, i)
			}
		}
		units := bt.c.units(bt.rows, todo)
		for k, u := range units {
			if time.Since(bt.txStart) > bt.budget && bt.firstRecorded {
				// Slow handlers: commit what ran, give the rest back.
				for _, u := range units[k:] {
					bt.late = append(bt.late, u.rows...)
				}
				for _, round := range rounds[r+1:] {
					bt.late = append(bt.late, round...)
				}
				return nil
			}
			if err := bt.runUnit(u); err != nil {
				return err
			}
		}
	}
	return nil
}

// runUnit runs one unit: a batch handler's call for several events, and
// if it fails, one call for each; or one event's handler.
func (bt *batch[TTx]) runUnit(u unit[TTx]) error {
	rows := bt.rows
	if u.batch != nil && len(u.rows) > 1 {
		bt.running = u.rows
		evs := make([]*Event, len(u.rows))
		for j, i := range u.rows {
			evs[j] = &rows[i].Event
		}
		called := time.Now()
		herr, stop := bt.call(u.rows[0], true, func(ctx context.Context, tx TTx) error { return bt.c.callBatch(ctx, tx, u.batch, evs) })
		bt.calls = append(bt.calls, handlerTime{typ: evs[0].Type, events: len(evs), took: time.Since(called)})
		if stop != nil {
			return stop
		}
		if herr == nil {
			for _, i := range u.rows {
				bt.record(i, nil, false)
			}
			return nil
		}
	}
	for _, i := range u.rows {
		bt.running = []int{i}
		handler, unhandled := bt.c.handlerFor(&rows[i].Event)
		called := time.Now()
		herr, stop := bt.call(i, false, func(ctx context.Context, tx TTx) error { return bt.c.callHandler(ctx, tx, handler, &rows[i].Event) })
		bt.calls = append(bt.calls, handlerTime{typ: rows[i].Event.Type, events: 1, took: time.Since(called)})
		if stop != nil {
			return stop
		}
		bt.record(i, herr, unhandled)
	}
	return nil
}

// call runs one handler call, in a savepoint when the run takes them; a
// non-nil stop means the transaction cannot go on.
func (bt *batch[TTx]) call(at int, isBatch bool, fn func(ctx context.Context, tx TTx) error) (herr, stop error) {
	ctx, sp := bt.ctx, bt.sp
	if sp == nil {
		herr = fn(ctx, bt.tx)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case herr != nil:
			return nil, &firstFailure{at: at, batch: isBatch, err: herr, untrusted: txAborted(herr)}
		}
		return nil, nil
	}
	if f := sp.first; f != nil && f.at == at && f.batch == isBatch && !f.untrusted {
		bt.firstRecorded = true
		return f.err, nil // it failed in the run without savepoints, whose writes are gone
	}
	herr = bt.b.Savepoint(ctx, bt.tx, fn)
	if errors.Is(herr, ferrydriver.ErrSavepoint) || ctx.Err() != nil {
		if herr == nil {
			herr = ctx.Err()
		}
		return nil, herr
	}
	return herr, nil
}

// record notes event i's outcome, to finish in the transaction.
func (bt *batch[TTx]) record(i int, herr error, unhandled bool) {
	row := bt.rows[i]
	o := batchOutcome{err: herr, unhandled: unhandled}
	f := ferrydriver.FinishedRow{EventID: row.Event.ID, Claim: row.Claim, State: ferrydriver.InboxProcessed}
	if herr != nil {
		o.dead, o.retryAt = bt.c.decide(row, herr)
		f.State, f.Error, f.RetryAt = ferrydriver.InboxFailed, herr.Error(), o.retryAt
		if o.dead {
			f.State = ferrydriver.InboxDead
		}
		bt.stopped[row.Event.Key] = true
	}
	bt.out[i] = o
	bt.fin.Rows = append(bt.fin.Rows, f)
}

// giveBackLate records the events that did not run: they run again at
// once, uncounted (a key's events after one that did not finish are not
// recorded; they wait behind it).
func (bt *batch[TTx]) giveBackLate() {
	now := time.Now()
	for _, i := range bt.late {
		why := "given back: its batch ran out of time before its turn"
		if bt.stopped[bt.rows[i].Event.Key] {
			why = "given back: an earlier event of its key did not finish"
		}
		bt.fin.Rows = append(bt.fin.Rows, ferrydriver.FinishedRow{EventID: bt.rows[i].Event.ID, Claim: bt.rows[i].Claim, State: ferrydriver.InboxFailed,
			Error: why, RetryAt: now, Uncounted: true})
	}
}

// rolledBack records what becomes of the batch's events when its
// transaction did not commit (err): lost claims are dropped, the failure
// charged counts, the rest is given back.
func (bt *batch[TTx]) rolledBack(ctx context.Context, err error, start time.Time) {
	c, b, rows, sp := bt.c, bt.b, bt.rows, bt.sp
	var lost *errBatchClaimLost
	var atCommit *ferrydriver.ClaimsLostError
	if errors.As(err, &atCommit) {
		// The driver found the lost claims with the commit.
		lost = &errBatchClaimLost{lost: make(map[uuid.UUID]bool, len(atCommit.Lost))}
		for _, id := range atCommit.Lost {
			lost.lost[id] = true
		}
		err = lost
	}
	switch {
	case errors.As(err, &lost):
		var back []*ferrydriver.InboxRow
		for _, row := range rows {
			if lost.lost[row.Event.ID] {
				c.m.outcomes.WithLabelValues("claim_lost").Inc()
				c.log.WarnContext(withEvent(ctx, &row.Event), "ferry: an event's claim was lost before its batch committed (it expired, or the event was retracted): the batch rolled back; the event runs again, or already did in a later attempt",
					"event_id", row.Event.ID, "key", row.Event.Key, "attempt", row.Attempts, "claim_ttl", c.cfg.ClaimTTL, "elapsed", time.Since(start).Round(time.Millisecond))
				continue
			}
			back = append(back, row)
		}
		back, failed := sp.chargeFirst(rows, back)
		c.giveBack(ctx, b, back, "rolled back with a batch in which another event's claim was lost", failed, start)
	case errors.Is(err, ferrydriver.ErrTxNotBegun):
		back, failed := sp.chargeFirst(rows, rows)
		for _, row := range back {
			c.notBegun(ctx, row, err)
		}
		if len(failed) > 0 {
			c.giveBack(ctx, b, nil, "", failed, start)
		}
	default:
		c.log.Warn("ferry: a batch's transaction failed; nothing of it was applied", "events", len(rows), "err", err)
		var back []*ferrydriver.InboxRow
		var failed []failedRow
		for i, row := range rows {
			if bt.running != nil && !slices.Contains(bt.running, i) {
				back = append(back, row)
			} else {
				failed = append(failed, failedRow{row, err})
			}
		}
		back, first := sp.chargeFirst(rows, back)
		// In one transaction: their claims end with the batch's, and a
		// key's events are recorded together (one that failed after an
		// earlier one of its key that is given back counts its attempt).
		c.giveBack(ctx, b, back, "rolled back with a batch whose transaction failed in another event's handler: "+err.Error(), append(failed, first...), start)
	}
}
