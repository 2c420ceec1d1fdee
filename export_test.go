package ferry

// SetParkedLoadCap lowers the number of parked keys r loads at once (the
// default is 100,000), for tests of a store holding more than that.
func SetParkedLoadCap(r *Relay, n int) { r.parkedLoadCap = n }
