package ferry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
)

// errBatchClaimLost rolls a batch back when some of its claims were lost:
// their handlers' writes are in the transaction.
type errBatchClaimLost struct{ lost map[uuid.UUID]bool }

func (e *errBatchClaimLost) Error() string {
	return fmt.Sprintf("the claims of %d events of the batch were lost", len(e.lost))
}

// batches cuts claimed rows (grouped by key, each key's in claim order)
// into batches of at most size rows, n of them if the keys allow,
// keeping each key's rows together and in order, the batches about even.
// Keys of a claim (ConsumerConfig.BatchSize rows at most each) that do
// not pack into n batches make one more, which waits for a free worker.
func batches(rows []*ferrydriver.InboxRow, n, size int) [][]*ferrydriver.InboxRow {
	n = max(n, 1)
	runs := runsOf(rows)
	n = min(n, len(runs))
	target := (len(rows) + n - 1) / max(n, 1)
	var out [][]*ferrydriver.InboxRow
	var cur []*ferrydriver.InboxRow
	for _, run := range runs {
		if len(cur) > 0 && (len(cur)+len(run) > size || (len(cur) >= target && len(out)+1 < n)) {
			out, cur = append(out, cur), nil
		}
		cur = append(cur, run...)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// runsOf cuts claimed rows (grouped by key) into each key's run.
func runsOf(rows []*ferrydriver.InboxRow) [][]*ferrydriver.InboxRow {
	var runs [][]*ferrydriver.InboxRow
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j].Event.Key == rows[i].Event.Key {
			j++
		}
		runs = append(runs, rows[i:j])
		i = j
	}
	return runs
}

// batchOutcome is what became of one event of a batch.
type batchOutcome struct {
	err       error // the handler's
	unhandled bool
	dead      bool
	retryAt   time.Time
}

// processBatch runs claimed events of different keys in one transaction
// and records every outcome with set-based statements before the commit:
// a failing handler's effects are rolled back and recorded as that event's
// failed attempt, and the others' effects commit.
//
// Without ConsumerConfig.SavepointEach the batch first runs with no
// savepoint. When a handler fails, that transaction is rolled back at
// once and the batch runs again with a savepoint per handler: the failed
// event is recorded with the error it just gave (its handler is not
// called again, so a failure costs it one call and one attempt), the
// handlers before it run again and commit, and the rest run once. For
// savepointCooldown after a failure, the consumer's batches take
// savepoints from the start. With SavepointEach every batch does.
func (c *Consumer[TTx]) processBatch(ctx context.Context, b ferrydriver.InboxBatcher[TTx], rows []*ferrydriver.InboxRow, deadline time.Time) {
	// A tenth of ClaimTTL earlier than one event's: what the batch gives
	// back must be back before the claims end.
	hctx, cancel := context.WithDeadline(ctx, deadline.Add(-c.cfg.ClaimTTL/10))
	defer cancel()
	start := time.Now()
	defer func() {
		per := time.Since(start).Seconds() / float64(len(rows))
		for range rows {
			c.m.handlerSeconds.Observe(per)
		}
	}()
	var first *firstFailure
	if !c.cfg.SavepointEach && time.Now().UnixNano() >= c.savepointsUntil.Load() {
		if first = c.applyBatch(ctx, hctx, b, rows, start, nil); first == nil {
			return
		}
		c.savepointsUntil.Store(time.Now().Add(c.savepointCooldown).UnixNano())
		c.log.Debug("ferry: a handler failed in a batch run without savepoints; the batch runs again with them",
			"event_id", rows[first.at].Event.ID, "events", len(rows), "err", first.err)
	}
	sp := &savepointRun{first: first}
	if first != nil && hctx.Err() != nil {
		// Stopping, or out of the claims' time: no second run. The
		// failure counts; the others run again, uncounted.
		back, failed := sp.chargeFirst(rows, rows)
		c.giveBack(ctx, b, back, "its batch had no time left to run again after another event's handler failed", failed, start)
		return
	}
	c.applyBatch(ctx, hctx, b, rows, start, sp)
}

// savepointCooldown is how long a consumer's batches take savepoints from
// the start after a handler failed in one (without SavepointEach): a failing
// dependency then does not make every batch run twice.
const savepointCooldown = 10 * time.Second

// firstFailure rolls back a batch run without savepoints: the handler
// call of rows[at] (a batch handler's call for several events starting
// there, if batch) failed with err. It does not wrap err, so that a
// transactor does not take it for a failure of its own to rerun.
type firstFailure struct {
	at    int
	batch bool
	err   error
	// untrusted: err says the transaction was already aborted (SQLSTATE
	// 25P02: an earlier handler swallowed its statement's error), so the
	// failure may not be this handler's: the run with savepoints calls it
	// again, and whichever savepoint then fails is charged.
	untrusted bool
}

func (f *firstFailure) Error() string {
	return fmt.Sprintf("a handler failed in a batch run without savepoints (it runs again with them): %v", f.err)
}

// txAborted says whether err is PostgreSQL's "current transaction is
// aborted" (SQLSTATE 25P02), from any driver whose errors tell their
// SQLSTATE.
func txAborted(err error) bool {
	var s interface{ SQLState() string }
	return errors.As(err, &s) && s.SQLState() == "25P02"
}

// savepointRun is a batch run with a savepoint per handler call, after
// first, the failure that ended a run without them (nil if none did).
type savepointRun struct {
	first *firstFailure
}

// charged is the failure the run records without calling its handler
// again, whose attempt counts whatever becomes of the run: first, when it
// is one event's and to be trusted; nil otherwise (sp may be nil).
func (sp *savepointRun) charged() *firstFailure {
	if sp == nil || sp.first == nil || sp.first.batch || sp.first.untrusted {
		return nil
	}
	return sp.first
}

// applyBatch runs the batch in one transaction: with a savepoint per
// handler call when sp is non-nil, and with none otherwise, where the
// first failing handler rolls the whole transaction back and is returned
// (nothing of the batch is recorded then: its claims stand for the run
// with savepoints). Every other outcome is recorded here. Handlers run
// under hctx; ctx is the worker's.
func (c *Consumer[TTx]) applyBatch(ctx, hctx context.Context, b ferrydriver.InboxBatcher[TTx], rows []*ferrydriver.InboxRow, start time.Time, sp *savepointRun) *firstFailure {
	bt := &batch[TTx]{c: c, b: b, rows: rows, sp: sp, out: make([]batchOutcome, len(rows)), budget: batchBudget(c.cfg.ClaimTTL)}
	began := time.Now()
	err := c.driver.RunInTx(hctx, bt.attempt)
	if err == nil {
		now := time.Now()
		if bt.attempts == 1 {
			c.costs.observe(bt.calls, now.Sub(began))
		}
		per := now.Sub(start) / time.Duration(len(rows))
		for i, row := range rows {
			if !slices.Contains(bt.late, i) {
				c.recordOutcome(ctx, row, bt.out[i], now, per)
			}
		}
		return nil
	}
	var first *firstFailure
	if sp == nil && errors.As(err, &first) {
		return first
	}
	bt.rolledBack(ctx, err, start)
	return nil
}

// chargeFirst takes out of back, the rows a failed run with savepoints
// gives back uncounted, the event of sp.charged(): its attempt counts,
// with the error it gave, whatever became of the run after it.
func (sp *savepointRun) chargeFirst(rows, back []*ferrydriver.InboxRow) ([]*ferrydriver.InboxRow, []failedRow) {
	f := sp.charged()
	if f == nil {
		return back, nil
	}
	row := rows[f.at]
	i := slices.Index(back, row)
	if i < 0 {
		return back, nil
	}
	return slices.Delete(slices.Clone(back), i, i+1), []failedRow{{row, f.err}}
}

// recordOutcome counts and logs what became of an event of a committed
// batch (which recorded it), committed at now after per of handler time.
func (c *Consumer[TTx]) recordOutcome(ctx context.Context, row *ferrydriver.InboxRow, o batchOutcome, now time.Time, per time.Duration) {
	ev := &row.Event
	if o.err == nil {
		c.meter.did(now, per, ev.CreatedAt)
	} else {
		c.meter.fail(1, 0)
	}
	switch {
	case o.err == nil && o.unhandled:
		c.m.outcomes.WithLabelValues("skipped").Inc()
	case o.err == nil:
		c.m.outcomes.WithLabelValues("processed").Inc()
	case o.dead:
		c.reportDead(ctx, row, o.err)
	default:
		c.m.outcomes.WithLabelValues("retried").Inc()
		c.log.InfoContext(withEvent(ctx, ev), "ferry: handler failed; will retry", "event_id", ev.ID, "attempt", row.Attempts, "retry_at", o.retryAt, "err", o.err)
	}
}

// errClaimsGone rolls back a give-back in which some claims had ended.
var errClaimsGone = errors.New("some claims had ended")

// failedRow is an event of a batch whose attempt failed with err.
type failedRow struct {
	row *ferrydriver.InboxRow
	err error
}

// giveBack returns claimed events of a batch to run again at once, not
// counted (their handlers succeeded or never ran; the batch rolled back
// for another event's sake), and records the failed attempt, counted, of
// those in failed (their handler call was running when the batch's
// transaction failed, or failed in a run without savepoints), in one
// transaction. An event whose claim ended meanwhile is left out: it is
// rescued, as any expired claim.
func (c *Consumer[TTx]) giveBack(ctx context.Context, b ferrydriver.InboxBatcher[TTx], rows []*ferrydriver.InboxRow, why string,
	failed []failedRow, start time.Time) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ClaimTTL)
	defer cancel()
	dead := make(map[uuid.UUID]bool, len(failed))
	for attempt := 0; len(rows)+len(failed) > 0 && attempt < 2; attempt++ {
		now := time.Now()
		fin := &ferrydriver.FinishInboxParams{Group: c.cfg.Group, Rows: make([]ferrydriver.FinishedRow, 0, len(rows)+len(failed))}
		for _, row := range rows {
			fin.Rows = append(fin.Rows, ferrydriver.FinishedRow{EventID: row.Event.ID, Claim: row.Claim, State: ferrydriver.InboxFailed,
				Error: "given back: " + why, RetryAt: now, Uncounted: true})
		}
		for _, fr := range failed {
			d, retryAt := c.decide(fr.row, fr.err)
			f := ferrydriver.FinishedRow{EventID: fr.row.Event.ID, Claim: fr.row.Claim, State: ferrydriver.InboxFailed, Error: fr.err.Error(), RetryAt: retryAt}
			if d {
				f.State = ferrydriver.InboxDead
			}
			dead[fr.row.Event.ID] = d
			fin.Rows = append(fin.Rows, f)
		}
		var lost []uuid.UUID
		err := c.driver.RunInTx(fctx, func(ctx context.Context, tx TTx) error {
			var err error
			if lost, err = b.FinishInboxTx(ctx, tx, fin); err == nil && len(lost) > 0 {
				return errClaimsGone
			}
			return err
		})
		var atCommit *ferrydriver.ClaimsLostError
		if errors.As(err, &atCommit) {
			lost, err = atCommit.Lost, errClaimsGone
		}
		if !errors.Is(err, errClaimsGone) {
			if err != nil {
				// The claims expire and the events run again: nothing is lost.
				c.log.Warn("ferry: giving back the events of a failed batch failed; they run again once their claims expire", "events", len(rows)+len(failed), "err", err)
				return
			}
			for _, fr := range failed {
				c.meter.fail(1, 0)
				if dead[fr.row.Event.ID] {
					c.reportDead(ctx, fr.row, fr.err)
				} else {
					c.m.outcomes.WithLabelValues("retried").Inc()
					c.log.InfoContext(withEvent(ctx, &fr.row.Event), "ferry: handler failed; will retry", "event_id", fr.row.Event.ID, "attempt", fr.row.Attempts, "err", fr.err)
				}
			}
			return
		}
		gone := func(r *ferrydriver.InboxRow) bool { return slices.Contains(lost, r.Event.ID) }
		for _, fr := range failed {
			if gone(fr.row) {
				c.m.outcomes.WithLabelValues("claim_lost").Inc()
				c.log.WarnContext(withEvent(ctx, &fr.row.Event), "ferry: an event's handler failed after its claim had ended: the failure is not recorded; the event runs again, or already did in a later attempt",
					"event_id", fr.row.Event.ID, "key", fr.row.Event.Key, "attempt", fr.row.Attempts, "claim_ttl", c.cfg.ClaimTTL, "elapsed", time.Since(start).Round(time.Millisecond), "err", fr.err)
			}
		}
		rows, failed = slices.DeleteFunc(rows, gone), slices.DeleteFunc(failed, func(fr failedRow) bool { return gone(fr.row) })
	}
}

// roundsOf orders a batch's rows (grouped by key, each key's in claim
// order) into rounds: the first row of every key, then the second, and so
// on. A round has one row per key at most, so its events of a type with a
// batch handler go in one call (of different keys, as HandleBatch
// promises), and every key runs in order.
func roundsOf(rows []*ferrydriver.InboxRow) [][]int {
	var out [][]int
	nth := 0
	for i, row := range rows {
		if i == 0 || row.Event.Key != rows[i-1].Event.Key {
			nth = 0
		}
		if nth == len(out) {
			out = append(out, nil)
		}
		out[nth] = append(out[nth], i)
		nth++
	}
	return out
}

// unit is what one handler call of a batch covers: events of a type with a
// batch handler (HandleBatch), or one event.
type unit[TTx any] struct {
	batch BatchHandlerFunc[TTx]
	rows  []int // indexes into the batch's rows
}

// units groups rows of one round (indexes into rows): those of a type
// with a batch handler by type, each other row alone, in the order of
// their first row.
func (c *Consumer[TTx]) units(rows []*ferrydriver.InboxRow, round []int) []unit[TTx] {
	var out []unit[TTx]
	byType := map[string]int{}
	for _, i := range round {
		row := rows[i]
		fn := c.batched[row.Event.Type]
		if fn == nil {
			out = append(out, unit[TTx]{rows: []int{i}})
			continue
		}
		j, ok := byType[row.Event.Type]
		if !ok {
			j = len(out)
			byType[row.Event.Type] = j
			out = append(out, unit[TTx]{batch: fn})
		}
		out[j].rows = append(out[j].rows, i)
	}
	return out
}

// callBatch runs a batch handler inside the middleware (see call).
func (c *Consumer[TTx]) callBatch(ctx context.Context, tx TTx, fn BatchHandlerFunc[TTx], evs []*Event) error {
	return c.call(ctx, evs, func(ctx context.Context) error { return fn(ctx, tx, evs) })
}

// batchBudget is how long a batch runs handlers before it commits what ran
// and gives the rest back: slow handlers (calls to other systems) then
// make small batches, and never a transaction that outlives its claims.
func batchBudget(claimTTL time.Duration) time.Duration {
	return min(claimTTL/4, time.Second)
}
