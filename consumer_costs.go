// What a consumer's transactions cost, learnt as they commit: how many
// transactions a claim's events are worth.

package ferry

import (
	"math"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// txCosts learns a consumer's costs from its transactions that committed
// at their first attempt: each event type's handler time per event (and
// every type's, for a type it keeps no average of), and the rest of a
// transaction's time (its begin, the finish that records the outcomes,
// its commit), each a moving average.
type txCosts struct {
	mu       sync.Mutex
	perType  map[string]time.Duration
	perEvent time.Duration // every type's
	perTx    time.Duration
	txs      int // transactions observed, up to warmTxs
}

// handlerTime is one handler call's time, for events events of type typ.
type handlerTime struct {
	typ    string
	events int
	took   time.Duration
}

const (
	// costWeight is the weight of a moving average's past: each
	// transaction moves it an eighth of the way to its own cost.
	costWeight = 8
	// warmTxs: a transaction's own cost is the least of the first
	// transactions' (a pool's first ones also connect), the moving
	// average after.
	warmTxs = 4
	// maxCostTypes bounds the event types whose costs are kept (a group
	// may see a type per event); events of a type not kept count at every
	// type's average.
	maxCostTypes = 1024
)

// observe records a transaction that committed at its first attempt,
// after total, its handlers' calls in calls.
func (t *txCosts) observe(calls []handlerTime, total time.Duration) {
	var handlers time.Duration
	for _, c := range calls {
		handlers += c.took
	}
	own := max(total-handlers, 0)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.txs == 0:
		t.perTx = own
	case t.txs < warmTxs:
		t.perTx = min(t.perTx, own)
	default:
		t.perTx += (own - t.perTx) / costWeight
	}
	t.txs = min(t.txs+1, warmTxs)
	if t.perType == nil {
		t.perType = map[string]time.Duration{}
	}
	for _, c := range calls {
		if c.events < 1 {
			continue
		}
		per := c.took / time.Duration(c.events)
		if t.perEvent == 0 {
			t.perEvent = per
		} else {
			t.perEvent += (per - t.perEvent) / costWeight
		}
		old, ok := t.perType[c.typ]
		switch {
		case ok:
			t.perType[c.typ] = old + (per-old)/costWeight
		case len(t.perType) < maxCostTypes:
			t.perType[c.typ] = per
		}
	}
}

// spread is how many transactions (n at most) the claimed rows go in: as
// few as keep each one's handlers within a transaction's own cost. Past
// that, a transaction more costs the database more than it saves the
// events' latency: fast handlers (a row's upsert) share a transaction and
// its commit, slow ones (a call to another service) get a worker each.
// A row of a type with no average of its own counts at every type's;
// until a transaction has committed, n.
func (t *txCosts) spread(rows []*ferrydriver.InboxRow, n int) int {
	if n <= 1 {
		return n
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.txs == 0 || t.perTx <= 0 {
		return n
	}
	var handlers float64 // ns; a float: a claim's may not fit a Duration
	for _, row := range rows {
		per, ok := t.perType[row.Event.Type]
		if !ok {
			per = t.perEvent
		}
		handlers += float64(per)
	}
	want := math.Ceil(handlers / float64(t.perTx))
	if want >= float64(n) {
		return n
	}
	return max(1, int(want))
}
