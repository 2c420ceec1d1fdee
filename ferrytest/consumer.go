package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

// DeliverTimeout is how long Deliver and Settle wait for the group to run
// an event before they fail the test.
const DeliverTimeout = time.Minute

// Consumer runs a consumer group's handlers in a test, without a broker or
// a relay: Deliver records an event in the group's inbox, as a source
// would, and returns once the group ran it. The consumer is the one the
// service builds (its configuration, its handlers), so what runs is what
// production runs: the handler's writes commit with the event's inbox row,
// a second delivery of the same event ID is recorded as a duplicate and
// runs nothing, and a handler's error rolls its transaction back and counts
// an attempt (the event is retried after ConsumerConfig.RetryBase, and goes
// DEAD after MaxAttempts).
type Consumer[TTx any] struct {
	t      testing.TB
	c      *ferry.Consumer[TTx]
	states ferrydriver.Settler
	done   chan error // Run's result

	mu  sync.Mutex
	seq map[string]int64 // the last Seq given to each key
}

// NewConsumer starts c (which has its handlers registered) for the test and
// stops it when the test ends. states reads the inbox: the driver c was
// built on.
func NewConsumer[TTx any](t testing.TB, c *ferry.Consumer[TTx], states ferrydriver.Settler) *Consumer[TTx] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &Consumer[TTx]{t: t, c: c, states: states, done: make(chan error, 1), seq: map[string]int64{}}
	go func() { h.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("ferrytest: consumer group %s: Run: %v", c.Group(), err)
			}
		case <-time.After(DeliverTimeout):
			t.Errorf("ferrytest: consumer group %s: Run did not return within %s of the test's end", c.Group(), DeliverTimeout)
		}
	})
	return h
}

// Delivery is what became of a delivered event.
type Delivery struct {
	// Duplicate is set when the group's inbox already had the event's ID:
	// nothing ran.
	Duplicate bool
	// State is the event's inbox state: PROCESSED, FAILED (to be retried),
	// DEAD, or for a duplicate whatever the first delivery reached.
	State ferrydriver.InboxState
	// Attempts counts the times the handler ran it.
	Attempts int
	// Error is the last failed attempt's error.
	Error string
}

// Deliver records ev in the group's inbox and returns once it has been
// attempted (or at once for a duplicate): PROCESSED, FAILED with the
// handler's error, or DEAD. A consumer that retries within milliseconds
// (ConsumerConfig.RetryBase) may have run later attempts already; Settle
// waits for the last. An event without ID or CreatedAt
// gets them; one without Seq gets its key's next number. Events of a key
// run in the order delivered: one delivered behind an event of its key that
// is FAILED or held DEAD waits for it, and Deliver fails the test after
// DeliverTimeout.
func (h *Consumer[TTx]) Deliver(ev *ferry.Event) Delivery {
	h.t.Helper()
	if err := ferryevent.Prepare(ev, 0, 0, time.Now()); err != nil {
		h.t.Fatalf("ferrytest: Deliver: %v", err)
		return Delivery{}
	}
	h.mu.Lock()
	if ev.Seq == 0 {
		ev.Seq = h.seq[ev.Key] + 1
	}
	h.seq[ev.Key] = max(h.seq[ev.Key], ev.Seq)
	h.mu.Unlock()
	n, err := h.c.Ingest(context.Background(), []*ferry.Event{ev})
	if err != nil {
		h.t.Fatalf("ferrytest: Deliver event %s to group %s: %v", ev.ID, h.c.Group(), err)
		return Delivery{}
	}
	d := h.wait(ev.ID, func(r *ferrydriver.InboxRow) bool {
		return n == 0 || (r.State != ferrydriver.InboxPending && r.State != ferrydriver.InboxProcessing)
	})
	d.Duplicate = n == 0
	return d
}

// Settle waits until the event is finished, its retries included
// (PROCESSED, DEAD, DISCARDED or RETRACTED), and returns what it became.
func (h *Consumer[TTx]) Settle(id uuid.UUID) Delivery {
	h.t.Helper()
	return h.wait(id, func(r *ferrydriver.InboxRow) bool {
		switch r.State {
		case ferrydriver.InboxProcessed, ferrydriver.InboxDead, ferrydriver.InboxDiscarded, ferrydriver.InboxRetracted:
			return true
		}
		return false
	})
}

// wait polls the event's inbox row until done accepts it.
func (h *Consumer[TTx]) wait(id uuid.UUID, done func(*ferrydriver.InboxRow) bool) Delivery {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DeliverTimeout)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var last *ferrydriver.InboxRow
	for {
		rows, err := h.states.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: h.c.Group(), EventIDs: []uuid.UUID{id}})
		if err != nil && ctx.Err() == nil {
			h.t.Fatalf("ferrytest: read event %s in group %s: %v", id, h.c.Group(), err)
			return Delivery{}
		}
		if r := rows[id]; r != nil {
			last = r
			if done(r) {
				return Delivery{State: r.State, Attempts: r.Attempts, Error: r.LastError}
			}
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("ferrytest: event %s in group %s: %s after %s (an earlier event of its key that failed or is held DEAD runs first)",
				id, h.c.Group(), describe(last), DeliverTimeout)
			return Delivery{}
		case err := <-h.done:
			h.done <- err // for the cleanup
			if err == nil {
				err = errors.New("it returned")
			}
			h.t.Fatalf("ferrytest: consumer group %s stopped: %v", h.c.Group(), err)
			return Delivery{}
		case <-tick.C:
		}
	}
}

func describe(r *ferrydriver.InboxRow) string {
	if r == nil {
		return "not in the inbox"
	}
	return fmt.Sprintf("still %s (attempts %d)", r.State, r.Attempts)
}
