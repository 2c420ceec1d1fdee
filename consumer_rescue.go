// The rescue of events whose claim expired: how long a claim may run
// late, how often expired claims are looked for, and the rescue groups
// that halve with each crash.

package ferry

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// claimGrace is how long a claim in flight may still answer after a stop:
// a quarter of the shutdown's time, at most a tenth of a claim's.
func (c *Consumer[TTx]) claimGrace() time.Duration {
	return min(c.cfg.ShutdownTimeout/4, c.cfg.ClaimTTL/10)
}

// rescueInterval is how often a consumer looks for expired claims.
func rescueInterval(ttl time.Duration) time.Duration {
	return min(max(ttl/4, 50*time.Millisecond), time.Second)
}

// rescue runs events whose last claims expired (their process crashed,
// or their handler outlived the claim), one of each key, alone: it waits
// for the running handlers to finish (for a ClaimTTL at most), holding
// every worker slot, so that an event that crashes the process costs no
// event outside its group an attempt. The group is bisected across
// crashes (see rescueGroup): a row's attempts count the crashes it was
// in, so the group that the most suspect row may run in halves with each,
// down to one row, and a row on its last attempt always runs alone. The
// rows run as Run's handlers, under work, keeping the slots until they
// finish: a stop cancels them within ShutdownTimeout like any handler (run
// on the claim loop, a rescued event held Run for its whole deadline). It
// reports whether it found any.
func (c *Consumer[TTx]) rescue(ctx, work context.Context, slots chan struct{}, handlers *sync.WaitGroup) bool {
	due, err := c.driver.RescueDue(ctx, c.cfg.Group)
	if err != nil || !due {
		if err != nil && ctx.Err() == nil {
			c.log.Warn("ferry: looking for expired claims failed; will retry", "err", err)
		}
		return false
	}
	// No delivery claims while the slots are gathered (its runs would
	// take slots and run beside the rescued events); the rescued events'
	// end clears it, or this function's when it hands nothing over.
	c.rescuing.Store(true)
	handed := false
	held := 0
	defer func() {
		for range held {
			<-slots
		}
		if !handed {
			c.rescuing.Store(false)
		}
	}()
	// Every handler running now must commit within its claim; one that
	// ignores its deadline is past it after a ClaimTTL, and its own claim
	// is then one to rescue too: the wait ends there.
	wait := time.NewTimer(c.cfg.ClaimTTL)
	defer wait.Stop()
drain:
	for range c.cfg.Workers {
		select {
		case slots <- struct{}{}:
			held++
		case <-wait.C:
			break drain
		case <-ctx.Done():
			return false
		}
	}
	deadline := time.Now().Add(c.cfg.ClaimTTL - c.cfg.ClaimTTL/10)
	rows, err := c.claim(ctx, &ferrydriver.ClaimInboxParams{Limit: max(held, 1), Rescue: true})
	if err != nil && len(rows) == 0 {
		if ctx.Err() == nil {
			c.log.Warn("ferry: rescuing an expired claim failed; will retry", "err", err)
		}
		return false
	}
	if len(rows) == 0 {
		return false
	}
	var dead, group []*ferrydriver.InboxRow
	for _, row := range rows {
		if row.State == ferrydriver.InboxDead {
			dead = append(dead, row)
		} else {
			group = append(group, row)
		}
	}
	// The most suspect first: it sets the group's size; the rest is given
	// back, its attempt not counted, for a later rescue.
	slices.SortStableFunc(group, func(a, b *ferrydriver.InboxRow) int { return cmp.Compare(b.Attempts, a.Attempts) })
	if len(group) > 0 {
		n := min(len(group), rescueGroup(group[0].Attempts, c.cfg.MaxAttempts, max(held, 1)))
		for _, row := range group[n:] {
			_ = c.failInbox(ctx, &ferrydriver.FailInboxParams{Group: c.cfg.Group, EventID: row.Event.ID, Claim: row.Claim,
				Error: "given back: rescued in a smaller group", RetryAt: time.Now(), Uncounted: true})
		}
		group = group[:n]
	}
	// The slots go with the rescued events: nothing else runs until they
	// are done.
	n := held
	held, handed = 0, true
	handlers.Go(func() {
		defer func() {
			c.rescuing.Store(false)
			for range n {
				<-slots
			}
			c.Notify()
		}()
		for _, row := range dead {
			c.reportDead(work, row, errors.New(row.LastError))
		}
		var wg sync.WaitGroup
		for _, row := range group {
			c.m.rescues.Inc()
			c.log.WarnContext(withEvent(work, &row.Event), "ferry: an event's last claim expired (its process crashed, or its handler outlived the claim); it runs again, alone or in a small group of such events",
				"event_id", row.Event.ID, "key", row.Event.Key, "type", row.Event.Type, "attempt", row.Attempts, "max_attempts", c.cfg.MaxAttempts, "group", len(group))
			wg.Go(func() { c.process(work, row, deadline, false) })
		}
		wg.Wait()
	})
	return true
}

// rescueGroup is how many rescued events may run together with one that
// has had attempts (this one included): all the workers on its first
// rescue (its second attempt), half as many with each attempt after, and
// one, alone, on its last attempt. An event that crashes its process
// every time is thus alone after about log2(workers) crashes, and an event
// that only shared its group is charged an attempt per crash at most, its
// last one never: it goes DEAD only by failing, or crashing, alone.
func rescueGroup(attempts, maxAttempts, workers int) int {
	if attempts >= maxAttempts || attempts < 2 {
		return 1
	}
	return max(1, workers>>min(attempts-2, 30))
}
