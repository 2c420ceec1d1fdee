// Running one claimed event: its handler in the transaction that completes
// it, and what a failure becomes (a retry at its backoff, or DEAD).

package ferry

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// handlerFor returns the handler of ev's type: the fallback (HandleAll)
// without one of its own, nil for a retraction nobody handles (logged) or
// a type skipped unhandled (SkipUnhandled: unhandled is true), and one
// that fails naming the type otherwise.
func (c *Consumer[TTx]) handlerFor(ev *Event) (handler HandlerFunc[TTx], unhandled bool) {
	handler = c.handlers[ev.Type]
	if handler == nil && ev.Type != ferryevent.TypeRetraction {
		handler = c.fallback
	}
	switch {
	case handler != nil:
	case ev.Type == ferryevent.TypeRetraction:
		c.log.Warn("ferry: an event this group processed was retracted, and the group has no retraction handler (HandleRetraction): nothing undoes its effect",
			"event_id", ev.ID, "key", ev.Key)
	case c.cfg.SkipUnhandled:
		unhandled = true
		if _, seen := c.skipped.LoadOrStore(ev.Type, true); !seen {
			c.log.Warn("ferry: skipping events of a type this group has no handler for (SkipUnhandled); logged once per type",
				"type", ev.Type, "event_id", ev.ID)
		}
	default:
		handler = func(context.Context, TTx, *Event) error {
			return fmt.Errorf("no handler for event type %q in group %s: register one (Handle, HandleEvent or HandleAll) and redrive, or set ConsumerConfig.SkipUnhandled to skip such events", ev.Type, c.cfg.Group)
		}
	}
	return handler, unhandled
}

// callHandler runs handler (nil: nothing to run) for ev, inside the
// middleware (see call).
func (c *Consumer[TTx]) callHandler(ctx context.Context, tx TTx, handler HandlerFunc[TTx], ev *Event) error {
	if handler == nil {
		return nil
	}
	return c.call(withEvent(ctx, ev), []*Event{ev}, func(ctx context.Context) error { return handler(ctx, tx, ev) })
}

// call runs one handler call for evs: with the group in ctx, inside the
// middleware, a panic turned into an error with its stack.
func (c *Consumer[TTx]) call(ctx context.Context, evs []*Event, run func(ctx context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return chain(c.cfg.Middleware, evs, run)(context.WithValue(ctx, groupKey{}, c.cfg.Group))
}

// batchHandlerRun is how many events of one key a batch takes when the
// consumer has batch handlers (HandleBatch), which get one call per round
// of a batch (one event of each key): a round trip per round, against two
// writes of a key's row per key, balanced.
func batchHandlerRun(batchSize int) int {
	return max(1, batchSize/8)
}

// maxRun bounds the events of one key that a worker claims at once to
// apply one per transaction (ConsumerConfig.BatchSize 1): a run costs
// one claim.
const maxRun = 32

// processRun applies claimed events one per transaction, in order: a run
// of one key's events claimed together (or one event). The claim stays on
// the run's later events while the earlier ones commit; when one does not
// finish (it failed, its claim was lost) the driver releases the rest,
// which run again, uncounted, and so does a run that outlives its time
// budget (see batchBudget).
func (c *Consumer[TTx]) processRun(ctx context.Context, rows []*ferrydriver.InboxRow, deadline time.Time) {
	start := time.Now()
	for i, row := range rows {
		if i > 0 && time.Since(start) > batchBudget(c.cfg.ClaimTTL) {
			c.giveBackRows(ctx, rows[i:], "its run ran out of time before its turn", start)
			return
		}
		if !c.process(ctx, row, deadline, i < len(rows)-1) {
			return
		}
	}
}

// giveBackRows gives claimed rows back to run again at once, their
// attempt not counted.
func (c *Consumer[TTx]) giveBackRows(ctx context.Context, rows []*ferrydriver.InboxRow, why string, start time.Time) {
	if c.finisher != nil {
		c.giveBack(ctx, c.finisher, rows, why, nil, start)
		return
	}
	for _, row := range rows {
		_ = c.failInbox(ctx, &ferrydriver.FailInboxParams{Group: c.cfg.Group, EventID: row.Event.ID, Claim: row.Claim,
			Error: "given back: " + why, RetryAt: time.Now(), Uncounted: true})
	}
}

// process runs one claimed event and records the outcome; keep keeps the
// claim on the later events of its run. It reports whether the event
// finished (processed, or skipped unhandled).
func (c *Consumer[TTx]) process(ctx context.Context, row *ferrydriver.InboxRow, deadline time.Time, keep bool) bool {
	ev := &row.Event
	handler, unhandled := c.handlerFor(ev)
	hctx, cancel := context.WithDeadline(ctx, deadline) // ctx: the work context, cancelled only by a stop past its grace
	defer cancel()
	start := time.Now()
	defer func() { c.m.handlerSeconds.Observe(time.Since(start).Seconds()) }()
	var handled time.Duration
	attempts := 0
	err := c.driver.RunInTx(hctx, func(ctx context.Context, tx TTx) error {
		attempts++
		called := time.Now()
		err := c.callHandler(ctx, tx, handler, ev)
		handled = time.Since(called)
		if err != nil {
			return err
		}
		return c.driver.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{
			Group: c.cfg.Group, EventID: ev.ID, Claim: row.Claim, Keep: keep})
	})
	if err == nil {
		now := time.Now()
		if attempts == 1 {
			c.costs.observe([]handlerTime{{typ: ev.Type, events: 1, took: handled}}, now.Sub(start))
		}
		c.meter.did(now, now.Sub(start), ev.CreatedAt)
		if unhandled {
			c.m.outcomes.WithLabelValues("skipped").Inc()
		} else {
			c.m.outcomes.WithLabelValues("processed").Inc()
		}
		return true
	}
	if errors.Is(err, ferrydriver.ErrClaimLost) {
		c.m.outcomes.WithLabelValues("claim_lost").Inc()
		c.log.WarnContext(withEvent(ctx, ev), "ferry: an event's handler outlived its claim: its effect was rolled back; the event runs again, or already did in a later attempt",
			"event_id", ev.ID, "key", ev.Key, "attempt", row.Attempts, "claim_ttl", c.cfg.ClaimTTL, "elapsed", time.Since(start).Round(time.Millisecond))
		return false
	}
	if errors.Is(err, ferrydriver.ErrTxNotBegun) {
		c.notBegun(ctx, row, err)
		return false
	}
	c.fail(ctx, row, err, start)
	return false
}

// fail records a failed attempt of row (started at start): FAILED with a
// retry time, or DEAD.
func (c *Consumer[TTx]) fail(ctx context.Context, row *ferrydriver.InboxRow, err error, start time.Time) {
	ev := &row.Event
	dead, retryAt := c.decide(row, err)
	ferr := c.failInbox(ctx, &ferrydriver.FailInboxParams{
		Group: c.cfg.Group, EventID: ev.ID, Claim: row.Claim, Error: err.Error(), RetryAt: retryAt, Dead: dead,
	})
	if errors.Is(ferr, ferrydriver.ErrClaimLost) {
		c.m.outcomes.WithLabelValues("claim_lost").Inc()
		c.log.WarnContext(withEvent(ctx, ev), "ferry: an event's handler failed after its claim had expired: the failure is not recorded; the event runs again, or already did in a later attempt",
			"event_id", ev.ID, "key", ev.Key, "attempt", row.Attempts, "claim_ttl", c.cfg.ClaimTTL, "elapsed", time.Since(start).Round(time.Millisecond), "err", err)
		return
	}
	if ferr != nil {
		// The claim expires and the event runs again: nothing is lost.
		c.log.WarnContext(withEvent(ctx, ev), "ferry: recording a failed attempt failed", "event_id", ev.ID, "err", ferr)
		return
	}
	if dead {
		c.meter.fail(1, 0)
		c.reportDead(ctx, row, err)
		return
	}
	c.meter.fail(1, 0)
	c.m.outcomes.WithLabelValues("retried").Inc()
	c.log.InfoContext(withEvent(ctx, ev), "ferry: handler failed; will retry", "event_id", ev.ID, "attempt", row.Attempts, "retry_at", retryAt, "err", err)
}

// failInbox records a failed attempt, even once ctx is done, within a
// ClaimTTL: a connection that went dark must not hold the worker (the claim
// expires and the event runs again anyway).
func (c *Consumer[TTx]) failInbox(ctx context.Context, p *ferrydriver.FailInboxParams) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ClaimTTL)
	defer cancel()
	return c.driver.FailInbox(fctx, p)
}

// notBegun gives back the claim of an event whose transaction could not
// begin (the handler never ran): it runs again shortly, and the attempt
// does not count.
func (c *Consumer[TTx]) notBegun(ctx context.Context, row *ferrydriver.InboxRow, err error) {
	ev := &row.Event
	ferr := c.failInbox(ctx, &ferrydriver.FailInboxParams{
		Group: c.cfg.Group, EventID: ev.ID, Claim: row.Claim, Error: err.Error(), RetryAt: time.Now().Add(c.retry.Delay(1) / 4),
		Uncounted: true})
	c.m.outcomes.WithLabelValues("not_begun").Inc()
	c.log.WarnContext(withEvent(ctx, ev), "ferry: could not begin a handler's transaction (is the connection pool smaller than Workers?); the handler did not run, and the attempt does not count",
		"event_id", ev.ID, "key", ev.Key, "workers", c.cfg.Workers, "err", err, "release_err", ferr)
}

// reportDead counts, logs and hands to OnDead an event that went DEAD.
func (c *Consumer[TTx]) reportDead(ctx context.Context, row *ferrydriver.InboxRow, err error) {
	ev := &row.Event
	c.meter.fail(0, 1)
	c.m.outcomes.WithLabelValues("dead").Inc()
	c.log.ErrorContext(withEvent(ctx, ev), "ferry: event is dead", "event_id", ev.ID, "key", ev.Key, "type", ev.Type, "attempts", row.Attempts, "err", err)
	if c.cfg.OnDead != nil {
		c.cfg.OnDead(ctx, &DeadEvent{Group: c.cfg.Group, Event: ev, Attempts: row.Attempts, Err: err})
	}
}

// decide turns a handler error into DEAD or a retry time.
func (c *Consumer[TTx]) decide(row *ferrydriver.InboxRow, err error) (dead bool, retryAt time.Time) {
	var gu *giveUpError
	if errors.As(err, &gu) || row.Attempts >= c.cfg.MaxAttempts {
		return true, time.Time{}
	}
	var ra *retryAfterError
	if errors.As(err, &ra) {
		return false, time.Now().Add(ra.after)
	}
	return false, time.Now().Add(c.retry.Delay(row.Attempts))
}

type retryAfterError struct {
	after time.Duration
	err   error
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("retry after %v: %v", e.after, e.err)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter makes a handler's failure retry after d instead of the
// backoff (a rate limit's Retry-After, a dependency's maintenance window).
// MaxAttempts still applies.
func RetryAfter(d time.Duration, err error) error { return &retryAfterError{after: d, err: err} }

type giveUpError struct{ err error }

func (e *giveUpError) Error() string { return "giving up: " + e.err.Error() }
func (e *giveUpError) Unwrap() error { return e.err }

// GiveUp makes a handler's failure final: the event goes DEAD at once
// (invalid input that no retry can fix).
func GiveUp(err error) error { return &giveUpError{err: err} }
