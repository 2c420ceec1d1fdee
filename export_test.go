package ferry

import "time"

// SetParkedLoadCap lowers the number of parked keys r loads at once (the
// default is 100,000), for tests of a store holding more than that.
func SetParkedLoadCap(r *Relay, n int) { r.parkedLoadCap = n }

// SetTxCosts sets what c has learnt its transactions cost: the handler
// time per event of events of type typ, and the rest of a transaction's.
func SetTxCosts[TTx any](c *Consumer[TTx], typ string, perEvent, perTx time.Duration) {
	c.costs.mu.Lock()
	defer c.costs.mu.Unlock()
	c.costs.perType, c.costs.perEvent = map[string]time.Duration{typ: perEvent}, perEvent
	c.costs.perTx, c.costs.txs = perTx, warmTxs
}
