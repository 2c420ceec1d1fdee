package ferry

import (
	"fmt"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/stretchr/testify/require"
)

// A claim's events go in as few transactions as keep each one's handlers
// within a transaction's own cost: all of its free workers until a
// transaction has committed, or when handlers are slow.
func TestTxCostsSpread(t *testing.T) {
	var c txCosts
	require.Equal(t, 8, c.spread(6, 8), "nothing learnt: every free worker")

	// Handlers of 100 µs an event, 2 ms of begin, finish and commit.
	c.observe(1, 100*time.Microsecond, 2100*time.Microsecond)
	require.Equal(t, 1, c.spread(6, 8), "six fast events: one transaction")
	require.Equal(t, 2, c.spread(40, 8), "40 events of 100 µs: 4 ms of handlers, two transactions of 2 ms")
	require.Equal(t, 8, c.spread(1000, 8), "never more than the free workers")
	require.Equal(t, 1, c.spread(6, 1))
	require.Equal(t, 1, c.spread(0, 8))

	// Handlers that call another service: a worker each.
	var slow txCosts
	slow.observe(4, 200*time.Millisecond, 202*time.Millisecond)
	require.Equal(t, 6, slow.spread(6, 6))
	require.Equal(t, 8, slow.spread(6, 8))

	// Moving averages: the handlers got slow, and each transaction moves
	// the estimate an eighth of the way.
	for range 40 {
		c.observe(1, 10*time.Millisecond, 12*time.Millisecond)
	}
	require.Equal(t, 8, c.spread(6, 8), "slow handlers now")
	c.mu.Lock()
	require.InDelta(t, float64(10*time.Millisecond), float64(c.perEvent), float64(100*time.Microsecond))
	require.InDelta(t, float64(2*time.Millisecond), float64(c.perTx), float64(100*time.Microsecond))
	c.mu.Unlock()

	// A transaction's time less its handlers' is never below zero.
	var odd txCosts
	odd.observe(2, 3*time.Millisecond, time.Millisecond)
	require.Equal(t, 4, odd.spread(4, 4), "no cost of its own learnt: every free worker")
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
