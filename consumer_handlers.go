// Registering a consumer's handlers: typed (decoded by their codec),
// batch, raw, for every type, and for retractions.

package ferry

import (
	"context"
	"strconv"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Handle registers fn for events of type eventType, with the payload
// decoded into a T by T's codec (Decode: JSON, or Protocol Buffers for a
// proto.Message once ferryproto's codec is registered). A payload that does
// not decode, or whose content type is another registered codec's, is a
// failure that retrying cannot fix: the event goes DEAD at once, with the
// reason.
func Handle[T any, TTx any](c *Consumer[TTx], eventType string, fn func(ctx context.Context, tx TTx, ev *Event, msg T) error) {
	c.HandleEvent(eventType, func(ctx context.Context, tx TTx, ev *Event) error {
		msg, err := Decode[T](ev)
		if err != nil {
			return GiveUp(err)
		}
		return fn(ctx, tx, ev, msg)
	})
}

// BatchHandlerFunc handles several events of one type, of different keys,
// inside tx, the transaction in which they are also marked processed: for
// handlers that write many rows in one statement. It must apply all of
// them or fail.
type BatchHandlerFunc[TTx any] func(ctx context.Context, tx TTx, evs []*Event) error

// HandleBatch registers fn for events of type eventType, with the payloads
// decoded into Ts as Handle decodes them (msgs[i] is evs[i]'s). With BatchSize > 1, one
// call gets every event of the type in a batch; when it fails, its writes
// are rolled back and fn runs again for each event alone, so that a
// failure stays the failing event's (its retries, DEAD, OnDead) and the
// others commit. With BatchSize 1, each call gets one event.
func HandleBatch[T any, TTx any](c *Consumer[TTx], eventType string, fn func(ctx context.Context, tx TTx, evs []*Event, msgs []T) error) {
	c.HandleEventBatch(eventType, func(ctx context.Context, tx TTx, evs []*Event) error {
		msgs := make([]T, len(evs))
		for i, ev := range evs {
			msg, err := Decode[T](ev)
			if err != nil {
				return GiveUp(err)
			}
			msgs[i] = msg
		}
		return fn(ctx, tx, evs, msgs)
	})
}

// HandleEventBatch is HandleBatch with the events undecoded.
func (c *Consumer[TTx]) HandleEventBatch(eventType string, fn BatchHandlerFunc[TTx]) {
	c.mustNotRun("HandleEventBatch(" + strconv.Quote(eventType) + ")")
	c.batched[eventType] = fn
	c.handlers[eventType] = func(ctx context.Context, tx TTx, ev *Event) error { return fn(ctx, tx, []*Event{ev}) }
}

// HandleEvent registers fn for events of type eventType, undecoded.
// Handlers are registered before Run; registering one after panics.
func (c *Consumer[TTx]) HandleEvent(eventType string, fn HandlerFunc[TTx]) {
	c.mustNotRun("HandleEvent(" + strconv.Quote(eventType) + ")")
	delete(c.batched, eventType)
	c.handlers[eventType] = fn
}

// HandleAll registers fn for every event type without a handler of its own.
// Without it, such events fail (see ConsumerConfig.SkipUnhandled).
func (c *Consumer[TTx]) HandleAll(fn HandlerFunc[TTx]) {
	c.mustNotRun("HandleAll")
	c.fallback = fn
}

func (c *Consumer[TTx]) mustNotRun(call string) {
	if c.frozen.Load() {
		panic("ferry: " + call + " on consumer " + c.cfg.Group + " after Run: register every handler before Consumer.Run (the workers read them without a lock)")
	}
}

// HandleRetraction registers fn to undo an event the group had processed
// when its source was undone (a chain reorg orphaned its block): fn gets
// the retracted event, runs in a transaction like any handler, and runs
// once, in the event's key order. Events retracted before they ran never
// run and need nothing.
func (c *Consumer[TTx]) HandleRetraction(fn HandlerFunc[TTx]) {
	c.mustNotRun("HandleRetraction")
	c.handlers[ferryevent.TypeRetraction] = func(ctx context.Context, tx TTx, comp *Event) error {
		ev, err := ferryevent.RetractedEvent(comp)
		if err != nil {
			return GiveUp(err)
		}
		return fn(ctx, tx, ev)
	}
}
