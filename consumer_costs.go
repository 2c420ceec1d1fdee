// What a consumer's transactions cost, learnt as they commit: how many
// transactions a claim's events are worth.

package ferry

import (
	"math"
	"sync"
	"time"
)

// txCosts learns a consumer's costs from its committed transactions:
// its handlers' time per event, and the rest of a transaction's time
// (its begin, the finish that records the outcomes, its commit), each a
// moving average.
type txCosts struct {
	mu       sync.Mutex
	perEvent time.Duration
	perTx    time.Duration
	seen     bool
}

// costWeight is the weight of a moving average's past: each transaction
// moves it an eighth of the way to its own cost.
const costWeight = 8

// observe records a committed transaction of events events that took
// total, handlers of it in the handlers' calls.
func (t *txCosts) observe(events int, handlers, total time.Duration) {
	if events < 1 {
		return
	}
	perEvent, perTx := handlers/time.Duration(events), max(total-handlers, 0)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.seen {
		t.perEvent, t.perTx, t.seen = perEvent, perTx, true
		return
	}
	t.perEvent += (perEvent - t.perEvent) / costWeight
	t.perTx += (perTx - t.perTx) / costWeight
}

// spread is how many transactions (n at most) the k events of a claim go
// in: as few as keep each one's handlers within a transaction's own cost.
// Past that, a transaction more costs the database more than it saves the
// events' latency: fast handlers (a row's upsert) share a transaction and
// its commit, slow ones (a call to another service) get a worker each.
// Until a transaction has committed, n.
func (t *txCosts) spread(k, n int) int {
	t.mu.Lock()
	perEvent, perTx, seen := t.perEvent, t.perTx, t.seen
	t.mu.Unlock()
	if !seen || perTx <= 0 || n <= 1 {
		return n
	}
	// In float: a handler's nanoseconds times a claim's events may
	// overflow.
	want := math.Ceil(float64(k) * float64(perEvent) / float64(perTx))
	if want >= float64(n) {
		return n
	}
	return max(1, int(want))
}
