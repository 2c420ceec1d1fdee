// Package memsink is an in-memory ferrysink.Sink for tests, with fault
// injection. It records what was "stored", in order.
package memsink

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// Sink stores events in memory.
type Sink struct {
	mu     sync.Mutex
	stored []ferryevent.Event
	at     []time.Time
	// FailRate is the probability that one publish fails transiently.
	FailRate float64
	// Permanent reports whether an event must fail permanently.
	Permanent func(*ferryevent.Event) bool
	// OnPublish, when set, runs before each call (e.g. to block).
	OnPublish func(ctx context.Context, events []*ferryevent.Event)
	// Fail reports whether an event must fail transiently (now).
	Fail func(*ferryevent.Event) bool
	// Stall reports whether an event is answered only after StallWait
	// returns (a destination that hangs for some keys); the call's other
	// events are answered first.
	Stall     func(*ferryevent.Event) bool
	StallWait func(ctx context.Context)
	// Ordered makes the sink report ferrysink.OrderedBatcher's promise, so
	// that the relay sends several events of a key in one call.
	Ordered bool
}

// OrderedBatches implements ferrysink.OrderedBatcher: it returns Ordered.
func (s *Sink) OrderedBatches() bool { return s.Ordered }

// ErrInjected is the transient failure FailRate injects.
var ErrInjected = errors.New("memsink: injected transient failure")

// Publish implements ferrysink.Sink.
func (s *Sink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	return s.PublishEach(ctx, events, nil)
}

// PublishEach implements ferrysink.EachPublisher. Events for which Stall
// returns true are answered last, after Stall's wait; the others at once.
func (s *Sink) PublishEach(ctx context.Context, events []*ferryevent.Event, done func(int, error)) []error {
	if s.OnPublish != nil {
		s.OnPublish(ctx, events)
	}
	out := make([]error, len(events))
	var stalled []int
	for i, e := range events {
		if s.Stall != nil && s.Stall(e) {
			stalled = append(stalled, i)
			continue
		}
		out[i] = s.one(ctx, e)
		if done != nil {
			done(i, out[i])
		}
	}
	if len(stalled) > 0 {
		s.StallWait(ctx)
		for _, i := range stalled {
			out[i] = s.one(ctx, events[i])
			if done != nil {
				done(i, out[i])
			}
		}
	}
	return out
}

func (s *Sink) one(ctx context.Context, e *ferryevent.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case ferrysink.Fenced(ctx) != nil:
		return ferrysink.Fenced(ctx)
	case s.Permanent != nil && s.Permanent(e):
		return ferrysink.Permanent("rejected by memsink", nil)
	case s.Fail != nil && s.Fail(e):
		return ErrInjected
	case s.FailRate > 0 && rand.Float64() < s.FailRate:
		return ErrInjected
	default:
		s.stored = append(s.stored, *e)
		s.at = append(s.at, time.Now())
		return nil
	}
}

// Close implements ferrysink.Sink.
func (s *Sink) Close(context.Context) error { return nil }

// Stored returns a copy of what was stored, in order.
func (s *Sink) Stored() []ferryevent.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ferryevent.Event(nil), s.stored...)
}

// StoredAt returns when each stored event was stored, in Stored's order.
func (s *Sink) StoredAt() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

// Len returns the number of stored events.
func (s *Sink) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.stored)
}
