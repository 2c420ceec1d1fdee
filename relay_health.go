package ferry

import (
	"sync"
	"time"
)

// RelayHealth is what a relay is doing, as a probe reads it (Relay.Health):
// whether it leads its partition, whether its checkpoint moves while
// events wait, and how long its oldest unacknowledged key has waited. The
// `ferry` daemon's /readyz and /livez are built on it.
type RelayHealth struct {
	// Feed is "<Feed>/<Partition>".
	Feed string
	// Running is set while Run runs.
	Running bool
	// Leading is set while the relay holds its partition's lease.
	Leading bool
	// Since is when Leading last changed: when the leadership began or
	// ended, or when Run started for a relay that never led (zero before
	// Run).
	Since time.Time
	// Waiting is the number of events committed and not yet passed by
	// the checkpoint: the larger of those the leader has read and not
	// delivered (or parked, or dead-lettered) and the feed's lag as the
	// last heartbeat counted it. Zero while standing by.
	Waiting int64
	// Moved is when the checkpoint last moved forward, or the leader last
	// found nothing waiting: Waiting > 0 with an old Moved is a stalled
	// partition (its destination hangs or refuses everything). Zero while
	// standing by.
	Moved time.Time
	// StuckKey is the key whose head event has waited longest for its
	// destination's acknowledgement (in flight, retried, parked or held),
	// as of the last heartbeat; StuckSince is when that event was first
	// handed to the sink, or parked by an earlier leader. Empty and zero
	// when every key's head was acknowledged.
	StuckKey   string
	StuckSince time.Time
	// Turned is when the leader's delivery loop last turned (it turns at
	// least every HeartbeatInterval): a leader whose loop has not turned
	// for longer than its LeaseTTL is wedged, since losing the lease ends
	// every wait of the loop. Zero while standing by.
	Turned time.Time
}

// Health returns a snapshot of what the relay is doing, for probes. It is
// cheap, safe to call from any goroutine and never touches the store.
func (r *Relay) Health() RelayHealth {
	r.health.mu.Lock()
	defer r.health.mu.Unlock()
	h := r.health.h
	h.Feed = r.name
	h.Running = r.running.Load()
	if h.Leading {
		h.Waiting = max(r.health.pending, r.health.lag)
	}
	return h
}

// relayHealth is the state Health reports, written by Run, the delivery
// loop, the heartbeat's lag refresh and the checkpointer.
type relayHealth struct {
	mu sync.Mutex // guards the fields below
	h  RelayHealth
	// pending is what the delivery loop has read and not passed; lag
	// what the heartbeat counted.
	pending, lag int64
}

// started records the start of Run.
func (s *relayHealth) started(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.h.Leading && s.h.Since.IsZero() {
		s.h.Since = now
	}
}

// leading records the start (true) or end of a leadership.
func (s *relayHealth) leading(lead bool, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h.Leading, s.h.Since = lead, now
	s.pending, s.lag = 0, 0
	s.h.StuckKey, s.h.StuckSince = "", time.Time{}
	s.h.Moved, s.h.Turned = time.Time{}, time.Time{}
	if lead {
		s.h.Moved, s.h.Turned = now, now
	}
}

// delivered records the delivery loop's position: pending events read
// and not passed; moved when the checkpoint moved forward.
func (s *relayHealth) delivered(pending int, moved bool, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = int64(pending)
	if moved || pending == 0 {
		s.h.Moved = now
	}
	s.h.Turned = now
}

// lagged records the feed's lag as the heartbeat counted it.
func (s *relayHealth) lagged(events int64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lag = events
	if events == 0 && s.pending == 0 {
		s.h.Moved = now
	}
}

// stuck records the key waiting longest for an acknowledgement ("" for
// none).
func (s *relayHealth) stuck(key string, since, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h.StuckKey, s.h.StuckSince, s.h.Turned = key, since, now
}
