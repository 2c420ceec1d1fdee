package ferry

import (
	"context"
)

// Middleware wraps every handler call of a consumer, for tracing, logging,
// metrics or code of your own (ConsumerConfig.Middleware). evs are the
// events the call applies: one, or for a batch handler (HandleBatch) a
// batch's events of one type. call runs the handler with the context it is
// given; a middleware calls it at most once, usually with ctx or a context
// derived from it, and returns its error (or one of its own, which fails
// the call like a handler error). The call runs inside the handler's
// transaction: a middleware that writes elsewhere should not count on it
// committing. ConsumerGroup(ctx) names the consumer's group.
type Middleware func(ctx context.Context, evs []*Event, call func(ctx context.Context) error) error

type (
	groupKey struct{}
	eventKey struct{}
)

// EventFromContext returns the event a handler call or a log record is
// about: the handler's ctx carries it (for a batch handler's call, nil),
// and so does the context of the consumer's and the relay's log records
// about one event (a failed attempt, a dead event, a dead letter, a held
// key), so that a log handler can add the event's trace (ferryotel's
// LogHandler does). Nil when there is none.
func EventFromContext(ctx context.Context) *Event {
	ev, _ := ctx.Value(eventKey{}).(*Event)
	return ev
}

// withEvent returns ctx carrying ev (EventFromContext).
func withEvent(ctx context.Context, ev *Event) context.Context {
	return context.WithValue(ctx, eventKey{}, ev)
}

// ConsumerGroup returns the consumer group whose handler call ctx belongs
// to ("" outside one): for middleware and handlers that label what they
// record by group.
func ConsumerGroup(ctx context.Context) string {
	g, _ := ctx.Value(groupKey{}).(string)
	return g
}

// chain returns call wrapped in mws, the first outermost.
func chain(mws []Middleware, evs []*Event, call func(ctx context.Context) error) func(ctx context.Context) error {
	for i := len(mws) - 1; i >= 0; i-- {
		mw, next := mws[i], call
		call = func(ctx context.Context) error { return mw(ctx, evs, next) }
	}
	return call
}
