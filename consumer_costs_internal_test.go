package ferry

import (
	"fmt"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/stretchr/testify/require"
)

// typed returns n claimed rows of type typ, of keys of their own.
func typed(typ string, n int) []*ferrydriver.InboxRow {
	out := make([]*ferrydriver.InboxRow, n)
	for i := range out {
		out[i] = &ferrydriver.InboxRow{}
		out[i].Event.Key, out[i].Event.Type = fmt.Sprintf("%s-%d", typ, i), typ
	}
	return out
}

func calls(typ string, n int, each time.Duration) []handlerTime {
	out := make([]handlerTime, n)
	for i := range out {
		out[i] = handlerTime{typ: typ, events: 1, took: each}
	}
	return out
}

// A claim's events go in as few transactions as keep each one's handlers
// within a transaction's own cost: all of its free workers until that is
// known, or when handlers are slow.
func TestTxCostsSpread(t *testing.T) {
	var c txCosts
	require.Equal(t, 8, c.spread(typed("Fast", 6), 8), "nothing learnt: every free worker")

	// Handlers of 100 µs an event, 2 ms of begin, finish and commit.
	c.observe(calls("Fast", 2, 100*time.Microsecond), 2200*time.Microsecond)
	require.Equal(t, 1, c.spread(typed("Fast", 6), 8), "six fast events: one transaction")
	require.Equal(t, 2, c.spread(typed("Fast", 40), 8), "40 events of 100 µs: 4 ms of handlers, two transactions of 2 ms")
	require.Equal(t, 8, c.spread(typed("Fast", 1000), 8), "never more than the free workers")
	require.Equal(t, 1, c.spread(typed("Fast", 6), 1))
	require.Equal(t, 1, c.spread(append(typed("Fast", 5), typed("New", 1)...), 8), "a type not seen yet counts at every type's average")

	// A type whose handler calls another service, beside the fast one: a
	// claim with one of its events spreads.
	c.observe(append(calls("Fast", 1, 100*time.Microsecond), calls("Slow", 1, 200*time.Millisecond)...), 202100*time.Microsecond)
	require.Equal(t, 1, c.spread(typed("Fast", 6), 8), "the fast type's cost is its own")
	require.Equal(t, 8, c.spread(append(typed("Fast", 5), typed("Slow", 1)...), 8))
	require.Equal(t, 8, c.spread(typed("New", 1), 8), "a new type counts at every type's average: about 25 ms now (the slow event weighs an eighth)")

	// Moving averages: the fast type's handler got slow, and each
	// transaction moves its estimate an eighth of the way.
	for range 40 {
		c.observe(calls("Fast", 1, 10*time.Millisecond), 12*time.Millisecond)
	}
	require.Equal(t, 8, c.spread(typed("Fast", 6), 8), "slow handlers now")
	c.mu.Lock()
	require.InDelta(t, float64(10*time.Millisecond), float64(c.perType["Fast"]), float64(100*time.Microsecond))
	require.InDelta(t, float64(2*time.Millisecond), float64(c.perTx), float64(100*time.Microsecond))
	c.mu.Unlock()
}

// A group that sees a type per event keeps averages of maxCostTypes of
// them; the rest count at every type's average.
func TestTxCostsManyTypes(t *testing.T) {
	var c txCosts
	for i := range maxCostTypes + 10 {
		c.observe(calls(fmt.Sprintf("T%d", i), 1, 100*time.Microsecond), 2100*time.Microsecond)
	}
	c.mu.Lock()
	require.Len(t, c.perType, maxCostTypes)
	c.mu.Unlock()
	require.Equal(t, 1, c.spread(typed("T-next", 6), 8), "six events of types never seen, at the average: one transaction")
}

// A transaction's own cost starts as the least of the first transactions'
// (a pool's first transactions also connect), and is never below zero.
func TestTxCostsWarmUp(t *testing.T) {
	var c txCosts
	c.observe(calls("T", 1, time.Millisecond), 41*time.Millisecond) // connected first
	c.observe(calls("T", 1, time.Millisecond), 3*time.Millisecond)
	c.observe(calls("T", 1, time.Millisecond), 5*time.Millisecond)
	c.mu.Lock()
	require.Equal(t, 2*time.Millisecond, c.perTx)
	c.mu.Unlock()

	var odd txCosts
	odd.observe(calls("T", 2, 3*time.Millisecond), time.Millisecond)
	odd.mu.Lock()
	require.Equal(t, time.Duration(0), odd.perTx)
	odd.mu.Unlock()
	require.Equal(t, 4, odd.spread(typed("T", 4), 4), "no cost of its own learnt: every free worker")
}

// batches cuts the claimed rows into as many batches as it is asked for,
// each key's rows in one, in order, none above the batch size.
func TestBatchesKeepKeysTogether(t *testing.T) {
	var rows []*ferrydriver.InboxRow
	for k := range 6 {
		for i := range k%3 + 1 { // keys of 1, 2 and 3 rows: 12 in all
			row := &ferrydriver.InboxRow{}
			row.Event.Key, row.Event.Seq = fmt.Sprintf("k%d", k), int64(i+1)
			rows = append(rows, row)
		}
	}
	shape := func(bs [][]*ferrydriver.InboxRow) []string {
		var out []string
		for _, b := range bs {
			s := ""
			for _, r := range b {
				s += fmt.Sprintf("%s/%d ", r.Event.Key, r.Event.Seq)
			}
			out = append(out, s)
		}
		return out
	}
	require.Equal(t, []string{"k0/1 k1/1 k1/2 k2/1 k2/2 k2/3 k3/1 k4/1 k4/2 k5/1 k5/2 k5/3 "}, shape(batches(rows, 1, 32)))
	require.Equal(t, []string{"k0/1 k1/1 k1/2 k2/1 k2/2 k2/3 ", "k3/1 k4/1 k4/2 k5/1 k5/2 k5/3 "}, shape(batches(rows, 2, 32)))
	require.Equal(t, []string{"k0/1 k1/1 k1/2 ", "k2/1 k2/2 k2/3 ", "k3/1 k4/1 k4/2 ", "k5/1 k5/2 k5/3 "}, shape(batches(rows, 8, 32)),
		"no more batches than keys, about even")
	for _, b := range batches(rows, 1, 4) {
		require.LessOrEqual(t, len(b), 4)
	}
}
