// Package memsink is an in-memory ferrysink.Sink for tests, with fault
// injection. It records what was "stored", in order.
package memsink

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// Sink stores events in memory.
type Sink struct {
	mu     sync.Mutex
	stored []ferryevent.Event
	calls  int
	// FailRate is the probability that one publish fails transiently.
	FailRate float64
	// Permanent reports whether an event must fail permanently.
	Permanent func(*ferryevent.Event) bool
	// OnPublish, when set, runs before each call (e.g. to block).
	OnPublish func(ctx context.Context, events []*ferryevent.Event)
}

// ErrInjected is the transient failure FailRate injects.
var ErrInjected = errors.New("memsink: injected transient failure")

// Publish implements ferrysink.Sink.
func (s *Sink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	if s.OnPublish != nil {
		s.OnPublish(ctx, events)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	out := make([]error, len(events))
	for i, e := range events {
		switch {
		case ctx.Err() != nil:
			out[i] = ctx.Err()
		case s.Permanent != nil && s.Permanent(e):
			out[i] = ferrysink.Permanent("rejected by memsink", nil)
		case s.FailRate > 0 && rand.Float64() < s.FailRate:
			out[i] = ErrInjected
		default:
			s.stored = append(s.stored, *e)
		}
	}
	return out
}

// Close implements ferrysink.Sink.
func (s *Sink) Close(context.Context) error { return nil }

// Stored returns a copy of what was stored, in order.
func (s *Sink) Stored() []ferryevent.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ferryevent.Event(nil), s.stored...)
}

// Len returns the number of stored events.
func (s *Sink) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.stored)
}
