// Package ferrysink is the seam between the relay and a message broker (or any
// other destination). An implementation publishes events and reports, for each
// one, whether the destination acknowledged it durably.
//
// Every implementation must pass the conformance suite in ferrysinktest.
//
// Ordering contract: the relay never puts two events with the same Key into
// one Publish call, and it never calls Publish again for a key before the
// previous call's outcome for that key is known, unless the sink implements
// OrderedBatcher and returns true. A sink may therefore publish everything in
// one call concurrently.
//
// Concurrency: the relay runs several Publish calls at once, never with one
// key in two of them, so every Sink must be safe for concurrent use. A sink
// that implements EachPublisher reports each event's outcome as soon as it
// is known; a key's next call may then start while other events of the
// earlier call are still in flight, so that one slow event holds back only
// its own key.
//
// Stability: this package may change between minor versions until 1.0.
package ferrysink

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Sink publishes events to a destination.
type Sink interface {
	// Publish publishes events and returns one error per event, in the same
	// order (nil: acknowledged durably). It returns when every event has an
	// outcome or ctx is done. A failure wrapped with Permanent will not be
	// retried: the relay dead-letters the event with the error as reason.
	// Any other failure is retried with backoff.
	Publish(ctx context.Context, events []*ferryevent.Event) []error
	// Close releases the sink's resources. Publish must not be called after.
	Close(ctx context.Context) error
}

// OrderedBatcher is implemented by sinks that keep per-key order within one
// Publish call, including across their own internal retries (for example a
// Kafka idempotent producer). The relay then sends whole batches at once.
//
// Such a sink must never acknowledge an event after failing an earlier
// event of the same key in the same call: once one fails, every later event
// of that key in the call must fail too (without being stored), because the
// relay retries the failed ones in a later call.
type OrderedBatcher interface {
	OrderedBatches() bool
}

// EachPublisher is implemented by sinks that can report each event's
// outcome as soon as the destination answers for it, rather than when the
// slowest event of the call is done.
type EachPublisher interface {
	// PublishEach is Publish that also calls done(i, err) once for every
	// event, with the error Publish returns for it, as soon as that
	// outcome is known: from any goroutine, and always before PublishEach
	// returns. done must not block for long.
	PublishEach(ctx context.Context, events []*ferryevent.Event, done func(i int, err error)) []error
}

// Describer is implemented by sinks that name the kind of destination they
// publish to, and by sources that name the broker they read, for telemetry
// (the OpenTelemetry messaging.system attribute, the system label of
// ferry_consumer_ingested_events_total): "nats", "kafka", "rabbitmq",
// "webhook". ferry.Consumer.Consume hands a Describer source's system to
// the consumer's Ingest through WithSystem.
type Describer interface {
	System() string
}

type systemKey struct{}

// WithSystem returns a context that carries system, the kind of transport
// the events of an ingest call came through ("nats", "webhook", "evm",
// ...): ferry.Consumer.Ingest reports it to its hooks (IngestInfo.System)
// and labels its metric with it. Consume sets it for a source that is a
// Describer; code that calls Ingest itself, such as a webhook receiver
// (ferrywebhook.Handler does) or ferrychain, sets it here.
func WithSystem(ctx context.Context, system string) context.Context {
	return context.WithValue(ctx, systemKey{}, system)
}

// SystemOf returns the system ctx carries (WithSystem), or "".
func SystemOf(ctx context.Context) string {
	s, _ := ctx.Value(systemKey{}).(string)
	return s
}

// DuplicateReporter is implemented by sinks whose destination reports the
// messages it dropped as duplicates of ones already stored (JetStream's
// PubAck.Duplicate). The relay logs and counts them: they measure how much
// a crash made it publish twice.
type DuplicateReporter interface {
	// Duplicates returns the number of duplicates dropped so far.
	Duplicates() uint64
}

// PermanentError marks a publish failure that retrying cannot fix: the event
// is too large for the destination, no route exists for its topic, the
// destination rejected it as malformed.
type PermanentError struct {
	// Reason is a short, human readable cause stored with the dead letter.
	Reason string
	Err    error
}

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent publish failure: " + e.Reason
	}
	return fmt.Sprintf("permanent publish failure: %s: %v", e.Reason, e.Err)
}

func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError with the given reason.
func Permanent(reason string, err error) error {
	return &PermanentError{Reason: reason, Err: err}
}

// IsPermanent reports whether err (or an error it wraps) is a PermanentError.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// Outcomes helps a sink implement both Publish and EachPublisher with one
// body: it holds a call's errors and reports each to done once. Use it from
// the goroutine running the call.
type Outcomes struct {
	errs     []error
	done     func(int, error)
	reported []bool
}

// NewOutcomes returns the outcomes of a call of n events; done may be nil
// (plain Publish).
func NewOutcomes(n int, done func(int, error)) *Outcomes {
	o := &Outcomes{errs: make([]error, n), done: done}
	if done != nil {
		o.reported = make([]bool, n)
	}
	return o
}

// Errs returns the call's errors; writing to it records an outcome that
// Finish reports.
func (o *Outcomes) Errs() []error { return o.errs }

// Set records event i's outcome and reports it now.
func (o *Outcomes) Set(i int, err error) {
	o.errs[i] = err
	if o.done != nil && !o.reported[i] {
		o.reported[i] = true
		o.done(i, err)
	}
}

// Finish reports every outcome not reported yet and returns the errors.
func (o *Outcomes) Finish() []error {
	for i := range o.reported {
		if !o.reported[i] {
			o.reported[i] = true
			o.done(i, o.errs[i])
		}
	}
	return o.errs
}

type fenceKey struct{}

// WithFence returns a context that carries fence, a check that a sink
// makes (through Fenced) right before it hands each event to its
// destination, within a Publish call: the relay's says whether it can
// still prove its lease. A leader paused in the middle of a call (a long
// GC, SIGSTOP) then hands nothing more over once resumed, even though its
// call carries on.
func WithFence(ctx context.Context, fence func() error) context.Context {
	return context.WithValue(ctx, fenceKey{}, fence)
}

// Fenced returns the error of ctx's fence (nil when there is none, or it
// passes). A sink that gets an error must not hand the event over and
// reports the error, wrapped, as that event's (transient) outcome.
func Fenced(ctx context.Context) error {
	if f, ok := ctx.Value(fenceKey{}).(func() error); ok {
		if err := f(); err != nil {
			return fmt.Errorf("not handed over: %w", err)
		}
	}
	return nil
}

// SingleReader is implemented by sources whose broker lets several
// processes read one ordering line at once and splits it between them (a
// JetStream durable): two readers would each ingest part of a key's
// events, out of order. ReaderName names the line ("nats/<stream>/
// <durable>"); ferry.Consumer.Consume holds a lease of that name in the
// consumer's store while it runs the source, so that one process reads
// the line at a time and another stands by to take over when it dies.
// Sources whose broker keeps one reader per line itself (Kafka's consumer
// groups, RabbitMQ's single active consumer) need not implement it.
type SingleReader interface {
	ReaderName() string
}

// Shared is implemented by sources divided into shares: fixed parts of
// the source, a key always in the same one, that separate processes read
// at once, each share by one reader (a JetStream source with
// SourceConfig.Shares: a durable per share). ferry.Consumer.Consume
// balances the shares over the processes that run it, as a
// ferry.Balancer balances a feed's partitions: each reads at most
// ceil(shares / processes), under a lease per share named
// "<ReaderName>/<share>", and one that dies has its shares taken over
// when their leases expire. Shares must not change while a group reads
// (a key would move to another share with events of it still unread).
// Sources whose broker balances its partitions itself (Kafka's consumer
// groups) need not implement it.
type Shared interface {
	SingleReader
	// Shares is the number of shares, at least 1.
	Shares() int
	// RunShare runs share i, 0 ≤ i < Shares(), as Source.Run runs the
	// whole source.
	RunShare(ctx context.Context, share int, ingest func(ctx context.Context, events []*ferryevent.Event) error) error
}

// Source delivers events from a broker to a consumer's inbox: the other
// direction of a Sink. ferry.Consumer.Consume runs one; ferrynats,
// ferrykafka and ferryrabbit have one each, and every implementation must
// pass ExerciseSource in ferrysinktest.
//
// Run hands each ordering unit's events (a key, a partition, a queue) to
// ingest in delivery order, and acknowledges them to the broker only after
// ingest returned nil: then they are durable in the inbox. A failed ingest
// is retried before anything later of its unit is ingested. Run blocks
// until ctx ends, then acknowledges what was ingested, gives the rest
// back to the broker and returns nil; it returns an error only for a
// problem retrying cannot fix (the broker's consumer or queue is gone),
// and retries outages itself. This is the shape of ferry.Relay.Run and
// ferry.Consumer.Run.
type Source interface {
	Run(ctx context.Context, ingest func(ctx context.Context, events []*ferryevent.Event) error) error
}
