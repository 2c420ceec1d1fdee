package ferrysinktest_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrysinktest"
)

// memSink is a minimal correct sink, used to check that the suite passes
// one: a suite that fails a correct sink is as broken as one that passes a
// wrong sink.
type memSink struct {
	maxPayload int
	unroutable string

	mu     sync.Mutex
	stored []ferrysinktest.Stored
	seen   map[uuid.UUID]bool
	closed bool
	// outage fails this many coming events as a cut connection would.
	outage int
}

func (s *memSink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	errs := make([]error, len(events))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ev := range events {
		switch {
		case s.closed:
			errs[i] = errors.New("memsink: closed")
		case ctx.Err() != nil:
			errs[i] = fmt.Errorf("memsink: %w", ctx.Err())
		case ferrysink.Fenced(ctx) != nil:
			errs[i] = fmt.Errorf("memsink: event %s %w", ev.ID, ferrysink.Fenced(ctx))
		case s.outage > 0:
			s.outage--
			errs[i] = errors.New("memsink: connection lost")
		case ev.Topic == s.unroutable:
			errs[i] = ferrysink.Permanent("no route for topic "+ev.Topic, nil)
		case len(ev.Payload) > s.maxPayload:
			errs[i] = ferrysink.Permanent("payload too large", nil)
		case s.seen[ev.ID]:
			// Dropped as a duplicate, acknowledged.
		default:
			s.seen[ev.ID] = true
			c := *ev
			c.Headers = maps.Clone(ev.Headers)
			c.Payload = slices.Clone(ev.Payload)
			s.stored = append(s.stored, ferrysinktest.Stored{Event: c})
		}
	}
	return errs
}

func (s *memSink) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func (s *memSink) read(context.Context) ([]ferrysinktest.Stored, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.stored), nil
}

func TestExerciseMemorySink(t *testing.T) {
	t.Parallel()
	const maxPayload = 1 << 20
	ferrysinktest.Exercise(t, ferrysinktest.Harness{
		Features: ferrysinktest.Features{
			BrokerDedup:     true,
			MaxPayloadBytes: maxPayload,
			UnroutableTopic: "nowhere",
		},
		New: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc) {
			s := &memSink{maxPayload: maxPayload, unroutable: "nowhere", seen: make(map[uuid.UUID]bool)}
			return s, s.read
		},
		NewFaulty: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc, func()) {
			s := &memSink{maxPayload: maxPayload, unroutable: "nowhere", seen: make(map[uuid.UUID]bool)}
			return s, s.read, func() { s.mu.Lock(); s.outage = 30; s.mu.Unlock() }
		},
	})
}
