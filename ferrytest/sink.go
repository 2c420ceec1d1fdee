package ferrytest

import (
	"context"
	"sync"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// Sink is an in-memory destination for a Relay: it keeps the events it is
// given, in the order it is given them. The zero value is ready to use.
type Sink struct {
	// Refuse, when set, is asked about each event before it is kept: an
	// error refuses it (wrap it with ferrysink.Permanent to have the relay
	// dead-letter the event; any other error is retried).
	Refuse func(*ferryevent.Event) error

	mu     sync.Mutex
	events []*ferryevent.Event
}

var _ ferrysink.Sink = (*Sink)(nil)

// Publish implements ferrysink.Sink.
func (s *Sink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	errs := make([]error, len(events))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ev := range events {
		if err := ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		if s.Refuse != nil {
			if errs[i] = s.Refuse(ev); errs[i] != nil {
				continue
			}
		}
		c := *ev
		s.events = append(s.events, &c)
	}
	return errs
}

// Close implements ferrysink.Sink.
func (s *Sink) Close(context.Context) error { return nil }

// Events returns what the sink kept, in order: each event as often as it
// was published (a relay publishes at least once, so a restart between a
// publish and its checkpoint shows an event twice).
func (s *Sink) Events() []*ferryevent.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*ferryevent.Event, len(s.events))
	copy(out, s.events)
	return out
}

// Reset forgets what the sink kept.
func (s *Sink) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = nil
}
