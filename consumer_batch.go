package ferry

import (
	"context"
	"errors"
	"fmt"
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

// split cuts rows into at most n batches of nearly equal sizes, in order.
func split[T any](rows []T, n int) [][]T {
	if n < 1 {
		n = 1
	}
	n = min(n, len(rows))
	out := make([][]T, 0, n)
	for i := range n {
		lo, hi := i*len(rows)/n, (i+1)*len(rows)/n
		out = append(out, rows[lo:hi])
	}
	return out
}

// batchOutcome is what became of one event of a batch.
type batchOutcome struct {
	err       error // the handler's
	unhandled bool
	dead      bool
	retryAt   time.Time
}

// processBatch runs claimed events of different keys in one transaction,
// each handler in a savepoint of its own, and records every outcome with
// set-based statements before the commit: a failing handler is rolled back
// to its savepoint and recorded as that event's failed attempt, and the
// others' effects commit. When the transaction itself fails, the attempt
// counts for the event whose handler was running (all of them when it
// failed at the end), and the others run again at once, uncounted.
func (c *Consumer[TTx]) processBatch(ctx context.Context, b ferrydriver.InboxBatcher[TTx], rows []*ferrydriver.InboxRow, deadline time.Time) {
	hctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	start := time.Now()
	defer func() {
		per := time.Since(start).Seconds() / float64(len(rows))
		for range rows {
			c.m.handlerSeconds.Observe(per)
		}
	}()
	out := make([]batchOutcome, len(rows))
	running := -1 // the event whose handler runs; -1: none (the end)
	err := c.driver.RunInTx(hctx, func(ctx context.Context, tx TTx) error {
		fin := &ferrydriver.FinishInboxParams{Group: c.cfg.Group, Rows: make([]ferrydriver.FinishedRow, len(rows))}
		for i, row := range rows {
			running = i
			handler, unhandled := c.handlerFor(&row.Event)
			herr := b.Savepoint(ctx, tx, func(ctx context.Context, tx TTx) error {
				return callHandler(ctx, tx, handler, &row.Event)
			})
			if errors.Is(herr, ferrydriver.ErrSavepoint) || ctx.Err() != nil {
				if herr == nil {
					herr = ctx.Err()
				}
				return herr // the transaction cannot go on
			}
			o := batchOutcome{err: herr, unhandled: unhandled}
			f := ferrydriver.FinishedRow{EventID: row.Event.ID, Claim: row.Claim, State: ferrydriver.InboxProcessed}
			if herr != nil {
				o.dead, o.retryAt = c.decide(row, herr)
				f.State, f.Error, f.RetryAt = ferrydriver.InboxFailed, herr.Error(), o.retryAt
				if o.dead {
					f.State = ferrydriver.InboxDead
				}
			}
			out[i], fin.Rows[i] = o, f
		}
		running = -1
		lost, err := b.FinishInboxTx(ctx, tx, fin)
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
	})
	if err == nil {
		for i, row := range rows {
			c.recordOutcome(ctx, row, out[i])
		}
		return
	}
	var lost *errBatchClaimLost
	switch {
	case errors.As(err, &lost):
		for _, row := range rows {
			if lost.lost[row.Event.ID] {
				c.m.outcomes.WithLabelValues("claim_lost").Inc()
				c.log.Warn("ferry: an event's claim was lost before its batch committed (it expired, or the event was retracted): the batch rolled back; the event runs again, or already did in a later attempt",
					"event_id", row.Event.ID, "key", row.Event.Key, "attempt", row.Attempts, "claim_ttl", c.cfg.ClaimTTL, "elapsed", time.Since(start).Round(time.Millisecond))
				continue
			}
			c.rerunUncounted(ctx, row, "rolled back with a batch in which another event's claim was lost")
		}
	case errors.Is(err, ferrydriver.ErrTxNotBegun):
		for _, row := range rows {
			c.notBegun(ctx, row, err)
		}
	default:
		c.log.Warn("ferry: a batch's transaction failed; nothing of it was applied", "events", len(rows), "err", err)
		for i, row := range rows {
			if running >= 0 && i != running {
				c.rerunUncounted(ctx, row, "rolled back with a batch whose transaction failed in another event's handler: "+err.Error())
				continue
			}
			c.fail(ctx, row, err, start)
		}
	}
}

// recordOutcome counts and logs what became of an event of a committed
// batch (which recorded it).
func (c *Consumer[TTx]) recordOutcome(ctx context.Context, row *ferrydriver.InboxRow, o batchOutcome) {
	ev := &row.Event
	switch {
	case o.err == nil && o.unhandled:
		c.m.outcomes.WithLabelValues("skipped").Inc()
	case o.err == nil:
		c.m.outcomes.WithLabelValues("processed").Inc()
	case o.dead:
		c.reportDead(ctx, row, o.err)
	default:
		c.m.outcomes.WithLabelValues("retried").Inc()
		c.log.Info("ferry: handler failed; will retry", "event_id", ev.ID, "attempt", row.Attempts, "retry_at", o.retryAt, "err", o.err)
	}
}

// rerunUncounted gives an event's claim back for an attempt at once, not
// counted: its handler succeeded or never ran, and the batch rolled back
// for another event's sake.
func (c *Consumer[TTx]) rerunUncounted(ctx context.Context, row *ferrydriver.InboxRow, why string) {
	err := c.failInbox(ctx, &ferrydriver.FailInboxParams{Group: c.cfg.Group, EventID: row.Event.ID, Claim: row.Claim,
		Error: why, RetryAt: time.Now(), Uncounted: true})
	if err != nil && !errors.Is(err, ferrydriver.ErrClaimLost) {
		// The claim expires and the event runs again: nothing is lost.
		c.log.Warn("ferry: giving back the claim of an event of a failed batch failed", "event_id", row.Event.ID, "err", err)
	}
}
