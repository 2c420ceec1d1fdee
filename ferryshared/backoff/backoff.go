// Package backoff computes capped exponential delays with full jitter.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy is a capped exponential backoff. The zero value is not usable; set
// Base and Max.
type Policy struct {
	Base time.Duration
	Max  time.Duration
}

// Delay returns the delay before retry number attempt (1 for the first
// retry): a random duration in [d/2, d] where d = min(Max, Base * 2^(attempt-1)).
// Half of the delay is fixed so that retries never hammer a recovering
// server, half is random so that many clients spread out.
func (p Policy) Delay(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := p.Base
	for i := 1; i < attempt && d < p.Max; i++ {
		d *= 2
	}
	if d > p.Max {
		d = p.Max
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}

// Sleep waits for the delay of attempt or until done is closed; it reports
// whether the full delay passed.
func (p Policy) Sleep(done <-chan struct{}, attempt int) bool {
	t := time.NewTimer(p.Delay(attempt))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}
