package ferryrabbit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
)

// Defaults applied by SourceConfig.WithDefaults.
const (
	DefaultBatch     = 256
	DefaultLinger    = 5 * time.Millisecond
	DefaultRetryBase = 100 * time.Millisecond
	DefaultRetryMax  = 30 * time.Second
	// DefaultQueueType is the type of a queue NewSource declares: quorum
	// queues are replicated and keep a requeued message's place.
	DefaultQueueType = "quorum"
	// DefaultSourceConnectionName is shown for the source's connection in
	// the management UI.
	DefaultSourceConnectionName = "ferry source"
)

// DefaultBindingKeys bind a declared queue to every routing key of the
// exchange.
var DefaultBindingKeys = []string{"#"}

// closeTimeout bounds the graceful close of the source's channel, which
// makes sure the broker applied the last acknowledgements, when Run stops.
const closeTimeout = 2 * time.Second

// SourceConfig configures a Source. Queue is required.
type SourceConfig struct {
	// URL is the AMQP URI of the broker. Default: DefaultURL.
	URL string

	// AMQP, when set, is the connection configuration passed to
	// amqp091.DialConfig (TLS, SASL, vhost, heartbeat, ...). Leave
	// Recovery nil: Run reconnects on its own.
	AMQP *amqp.Config

	// ConnectionName is the connection_name client property, unless
	// AMQP.Properties sets one. Default: DefaultSourceConnectionName.
	ConnectionName string

	// DialTimeout bounds each connection attempt. Default:
	// DefaultDialTimeout.
	DialTimeout time.Duration

	// Queue is the queue the source consumes, typically one per consumer
	// group. Required.
	//
	// The queue is one ordering line: consume it with one Source at a time.
	// Declare it with x-single-active-consumer, as NewSource does with
	// DeclareQueue, so that RabbitMQ delivers to one Source only and keeps
	// the others on standby.
	Queue string

	// DeclareQueue makes NewSource declare Queue, durable, with
	// x-queue-type QueueType, x-single-active-consumer true and QueueArgs,
	// and bind it to Exchange with each of BindingKeys. An existing queue
	// must have the same arguments (RabbitMQ refuses to change them). When
	// false, NewSource fails if the queue is missing.
	DeclareQueue bool

	// QueueType is the x-queue-type of a declared queue: "quorum" or
	// "classic". Default: DefaultQueueType.
	QueueType string

	// QueueArgs are further arguments of a declared queue, such as
	// x-dead-letter-exchange, where the messages Run rejects as not being
	// Ferry events go. They take precedence over the source's own.
	QueueArgs amqp.Table

	// Exchange is the exchange a declared queue is bound to, the sink's
	// Config.Exchange. Default: DefaultExchange.
	Exchange string

	// DeclareExchange makes NewSource declare Exchange, durable and of type
	// ExchangeType, as the sink's Config.DeclareExchange does, before
	// binding a declared queue to it.
	DeclareExchange bool

	// ExchangeType is the type of a declared exchange. Default:
	// DefaultExchangeType.
	ExchangeType string

	// BindingKeys are the binding keys of a declared queue: routing key
	// patterns, "*" matching one dot-separated word and "#" any number, on
	// a topic exchange. Default: DefaultBindingKeys.
	BindingKeys []string

	// Batch is the most events handed to ingest at a time, and the
	// channel's prefetch count: RabbitMQ sends no more messages than this
	// before they are acknowledged. Default: DefaultBatch.
	Batch int

	// Linger is how long Run waits, once a message has arrived, for more to
	// fill the batch before it hands over what it has. Default:
	// DefaultLinger.
	Linger time.Duration

	// RetryBase and RetryMax bound the exponential backoff, with jitter,
	// between attempts to ingest a batch that failed, and between attempts
	// to reconnect. Defaults: DefaultRetryBase, and DefaultRetryMax or
	// RetryBase if larger.
	RetryBase, RetryMax time.Duration

	// OnInvalid is called, from Run's goroutine, with a message that does
	// not decode as a Ferry event (err wraps ErrMalformed). The message is
	// then rejected without requeueing: the queue's dead-letter exchange
	// receives it if it has one, else RabbitMQ drops it. Keep it short; the
	// line waits for it. Default: log the message at level Error.
	OnInvalid func(ctx context.Context, d amqp.Delivery, err error)

	// Logger receives the source's warnings (failed ingests, lost
	// connections) and debug messages. Default: slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c (which may be nil) with every unset field
// set to its default.
func (c *SourceConfig) WithDefaults() *SourceConfig {
	var out SourceConfig
	if c != nil {
		out = *c
	}
	if out.URL == "" {
		out.URL = DefaultURL
	}
	if out.ConnectionName == "" {
		out.ConnectionName = DefaultSourceConnectionName
	}
	if out.DialTimeout == 0 {
		out.DialTimeout = DefaultDialTimeout
	}
	if out.QueueType == "" {
		out.QueueType = DefaultQueueType
	}
	if out.Exchange == "" {
		out.Exchange = DefaultExchange
	}
	if out.ExchangeType == "" {
		out.ExchangeType = DefaultExchangeType
	}
	if len(out.BindingKeys) == 0 {
		out.BindingKeys = DefaultBindingKeys
	}
	if out.Batch == 0 {
		out.Batch = DefaultBatch
	}
	if out.Linger == 0 {
		out.Linger = DefaultLinger
	}
	if out.RetryBase == 0 {
		out.RetryBase = DefaultRetryBase
	}
	if out.RetryMax == 0 {
		out.RetryMax = max(DefaultRetryMax, out.RetryBase)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// validate checks a SourceConfig that went through WithDefaults.
func (c *SourceConfig) validate() error {
	if err := checkURL(c.URL, "SourceConfig.URL"); err != nil {
		return err
	}
	switch {
	case c.Queue == "":
		return errors.New("ferryrabbit: SourceConfig.Queue is empty; name the queue to consume, typically after the consumer group")
	case len(c.Queue) > maxShortString:
		return fmt.Errorf("ferryrabbit: SourceConfig.Queue is %d bytes long, more than AMQP's %d", len(c.Queue), maxShortString)
	case c.DeclareQueue && strings.HasPrefix(c.Queue, "amq."):
		return fmt.Errorf(`ferryrabbit: SourceConfig.Queue %q starts with "amq.", which RabbitMQ reserves; choose another name`, c.Queue)
	case c.DeclareQueue && c.QueueType != "quorum" && c.QueueType != "classic":
		return fmt.Errorf(`ferryrabbit: SourceConfig.QueueType is %q; set "quorum" or "classic" (streams do not support the acknowledgements Run relies on)`, c.QueueType)
	case c.DialTimeout < 0:
		return fmt.Errorf("ferryrabbit: SourceConfig.DialTimeout is %s; set it > 0, or 0 for %s", c.DialTimeout, DefaultDialTimeout)
	case c.Batch < 0 || c.Batch > 65535:
		return fmt.Errorf("ferryrabbit: SourceConfig.Batch is %d; set it between 1 and 65535 (the largest AMQP prefetch count), or 0 for %d", c.Batch, DefaultBatch)
	case c.Linger < 0:
		return fmt.Errorf("ferryrabbit: SourceConfig.Linger is %s; set it > 0, or 0 for %s", c.Linger, DefaultLinger)
	case c.RetryBase < 0:
		return fmt.Errorf("ferryrabbit: SourceConfig.RetryBase is %s; set it > 0, or 0 for %s", c.RetryBase, DefaultRetryBase)
	case c.RetryMax < c.RetryBase:
		return fmt.Errorf("ferryrabbit: SourceConfig.RetryMax (%s) is less than SourceConfig.RetryBase (%s); raise RetryMax", c.RetryMax, c.RetryBase)
	case c.AMQP != nil && c.AMQP.Recovery != nil:
		return errors.New("ferryrabbit: SourceConfig.AMQP.Recovery is set; leave it nil: Run reconnects itself, in an order that keeps the queue's order")
	}
	if c.DeclareQueue {
		if reason := invalidExchange(c.Exchange, c.DeclareExchange); reason != "" {
			return fmt.Errorf("ferryrabbit: SourceConfig.Exchange %q cannot be used: %s", c.Exchange, reason)
		}
		for _, k := range c.BindingKeys {
			if len(k) > maxShortString {
				return fmt.Errorf("ferryrabbit: SourceConfig.BindingKeys holds a key of %d bytes, more than AMQP's %d", len(k), maxShortString)
			}
		}
	}
	return nil
}

// queueArgs are the arguments of a declared queue.
func (c *SourceConfig) queueArgs() amqp.Table {
	args := amqp.Table{
		"x-queue-type":             c.QueueType,
		"x-single-active-consumer": true,
	}
	maps.Copy(args, c.QueueArgs)
	return args
}

// Source consumes the events a Sink published from a RabbitMQ queue and
// hands them to a consumer's inbox. Create it with NewSource and call Run.
type Source struct {
	cfg     *SourceConfig // WithDefaults applied
	log     *slog.Logger
	url     string // redacted
	running atomic.Bool
}

// NewSource checks the source's configuration and the queue: it connects to
// the broker, declares the exchange, the queue and its bindings when asked
// (DeclareExchange, DeclareQueue), or else checks that the queue exists,
// and disconnects. Run connects again. cfg must name the Queue.
func NewSource(ctx context.Context, cfg *SourceConfig) (*Source, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	s := &Source{cfg: c, log: c.Logger.With("queue", c.Queue), url: redact(c.URL)}
	conn, err := dial(ctx, c.URL, c.AMQP, c.ConnectionName, c.DialTimeout)
	if err != nil {
		return nil, fmt.Errorf("ferryrabbit: connect to %s: %w; check SourceConfig.URL and that RabbitMQ is running and reachable", s.url, err)
	}
	defer func() { _ = closeConn(conn, time.Now().Add(time.Second)) }()
	if err := s.prepare(conn); err != nil {
		return nil, err
	}
	return s, nil
}

// prepare declares or checks the topology, each step on a channel of its
// own: a failed step closes the channel it ran on.
func (s *Source) prepare(conn *amqp.Connection) error {
	c := s.cfg
	step := func(f func(ch *amqp.Channel) error) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("ferryrabbit: open a channel on %s: %w", s.url, err)
		}
		defer closeChannel(ch)
		return f(ch)
	}
	if !c.DeclareQueue {
		return step(func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(c.Queue, true, false, false, false, nil)
			if hasCode(err, amqp.NotFound) {
				return fmt.Errorf("ferryrabbit: queue %q not found: declare it (durable, x-queue-type quorum, x-single-active-consumer true) and bind it to the sink's exchange, or set SourceConfig.DeclareQueue: %w", c.Queue, err)
			}
			if err != nil {
				return fmt.Errorf("ferryrabbit: look up queue %q: %w", c.Queue, err)
			}
			return nil
		})
	}
	err := step(func(ch *amqp.Channel) error {
		if c.DeclareExchange {
			err := ch.ExchangeDeclare(c.Exchange, c.ExchangeType, true, false, false, false, nil)
			if err != nil {
				return fmt.Errorf("ferryrabbit: declare exchange %q of type %q: %w; if it exists with other settings, use it as it is and unset SourceConfig.DeclareExchange", c.Exchange, c.ExchangeType, err)
			}
			return nil
		}
		err := ch.ExchangeDeclarePassive(c.Exchange, c.ExchangeType, true, false, false, false, nil)
		if hasCode(err, amqp.NotFound) {
			return fmt.Errorf("ferryrabbit: exchange %q, which SourceConfig.Exchange names for the queue's bindings, not found: create the sink first (Config.DeclareExchange) or set SourceConfig.DeclareExchange: %w", c.Exchange, err)
		}
		if err != nil {
			return fmt.Errorf("ferryrabbit: look up exchange %q: %w", c.Exchange, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return step(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(c.Queue, true, false, false, false, c.queueArgs())
		switch {
		case hasCode(err, amqp.PreconditionFailed):
			return fmt.Errorf("ferryrabbit: queue %q exists with other arguments than SourceConfig.QueueType and QueueArgs ask for (RabbitMQ cannot change them): %w; match its arguments, or unset SourceConfig.DeclareQueue to use it as it is", c.Queue, err)
		case err != nil:
			return fmt.Errorf("ferryrabbit: declare queue %q: %w", c.Queue, err)
		}
		for _, key := range c.BindingKeys {
			if err := ch.QueueBind(c.Queue, key, c.Exchange, false, nil); err != nil {
				return fmt.Errorf("ferryrabbit: bind queue %q to exchange %q with key %q: %w", c.Queue, c.Exchange, key, err)
			}
		}
		return nil
	})
}

// errQueueGone marks the end of Run when its queue no longer exists.
var errQueueGone = errors.New("ferryrabbit: queue not found")

// Run consumes the queue and hands its events to ingest until ctx ends,
// then returns nil. ingest must record the events durably, deduplicated by
// ID, and return nil only then; Consumer.Ingest does:
//
//	err := src.Run(ctx, func(ctx context.Context, evs []*ferryevent.Event) error {
//		_, err := consumer.Ingest(ctx, evs)
//		return err
//	})
//
// Events reach ingest in queue order, at most SourceConfig.Batch at a time,
// and a batch is acknowledged (one multiple ack up to its last message)
// only after ingest returned nil for it. When ingest fails, Run
// acknowledges nothing, backs off and hands it the same batch again,
// ingesting nothing later meanwhile, until it succeeds or ctx ends: the
// batch's messages stay delivered to Run, unacknowledged, so RabbitMQ
// neither redelivers them nor counts a redelivery. ingest may still see an
// event twice (after a lost connection or a restart), which an inbox that
// deduplicates by ID absorbs.
//
// A message that does not decode goes to SourceConfig.OnInvalid and is
// rejected without requeueing (to the queue's dead-letter exchange, if it
// has one); the rest of its batch is ingested.
//
// When the connection or channel is lost, Run reconnects with backoff and
// consumes again; RabbitMQ has put the unacknowledged messages back in the
// queue ahead of the later ones, so they come first. When ctx ends, Run
// acknowledges what ingest accepted, closes its channel, which requeues the
// rest, and returns within a few seconds.
//
// Run returns an error when ingest is nil, when Run is already running, or
// when the queue no longer exists. It retries everything else.
func (s *Source) Run(ctx context.Context, ingest func(ctx context.Context, events []*ferryevent.Event) error) error {
	if ingest == nil {
		return errors.New("ferryrabbit: Source.Run needs an ingest function, one that records events in the consumer's inbox (Consumer.Ingest)")
	}
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("ferryrabbit: Source.Run is already running for queue %q; run one Source per queue at a time", s.cfg.Queue)
	}
	defer s.running.Store(false)
	r := &run{
		s:      s,
		ingest: ingest,
		retry:  backoff.Policy{Base: s.cfg.RetryBase, Max: s.cfg.RetryMax},
	}
	for attempt := 1; ctx.Err() == nil; attempt++ {
		consumed, err := r.consume(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errQueueGone):
			return err
		case consumed:
			attempt = 1
		}
		s.log.Warn("ferryrabbit: consuming stopped; reconnecting", "attempt", attempt, "err", err)
		if !r.retry.Sleep(ctx.Done(), attempt) {
			return nil
		}
	}
	return nil
}

// run is the state of one Source.Run call.
type run struct {
	s      *Source
	ingest func(context.Context, []*ferryevent.Event) error
	retry  backoff.Policy
}

// consume connects, consumes until the connection, channel or consumer
// ends (returning why) or ctx ends (returning nil), and disconnects.
// consumed reports whether the consumer was registered.
func (r *run) consume(ctx context.Context) (consumed bool, err error) {
	c := r.s.cfg
	conn, err := dial(ctx, c.URL, c.AMQP, c.ConnectionName, c.DialTimeout)
	if err != nil {
		return false, fmt.Errorf("connect to %s: %w", r.s.url, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = closeConn(conn, time.Now().Add(time.Second))
		return false, fmt.Errorf("open a channel: %w", err)
	}
	defer r.disconnect(conn, ch)
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(c.Batch, 0, false); err != nil {
		return false, fmt.Errorf("set the prefetch count to SourceConfig.Batch (%d): %w", c.Batch, err)
	}
	deliveries, err := ch.Consume(c.Queue, "", false, false, false, false, nil)
	switch {
	case hasCode(err, amqp.NotFound):
		return false, fmt.Errorf("%w: queue %q no longer exists (%v); declare it again (NewSource with SourceConfig.DeclareQueue) and call Run", errQueueGone, c.Queue, err)
	case err != nil:
		return false, fmt.Errorf("consume queue %q: %w", c.Queue, err)
	}
	r.s.log.Debug("ferryrabbit: consuming", "prefetch", c.Batch)

	for {
		batch, open := r.collect(ctx, deliveries)
		if len(batch) > 0 {
			if err := r.handle(ctx, ch, closes, batch); err != nil {
				return true, err
			}
		}
		if !open {
			select {
			case cause := <-closes:
				if cause != nil {
					return true, fmt.Errorf("the channel closed: %w", cause)
				}
			default:
			}
			return true, errors.New("RabbitMQ cancelled the consumer (was the queue deleted?)")
		}
		if ctx.Err() != nil {
			return true, nil
		}
	}
}

// collect waits for a delivery, then for more until the batch is full or
// Linger has passed. open is false once deliveries is closed.
func (r *run) collect(ctx context.Context, deliveries <-chan amqp.Delivery) (batch []amqp.Delivery, open bool) {
	select {
	case d, ok := <-deliveries:
		if !ok {
			return nil, false
		}
		batch = append(batch, d)
	case <-ctx.Done():
		return nil, true
	}
	linger := time.NewTimer(r.s.cfg.Linger)
	defer linger.Stop()
	for len(batch) < r.s.cfg.Batch {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch, false
			}
			batch = append(batch, d)
		case <-linger.C:
			return batch, true
		case <-ctx.Done():
			return batch, true
		}
	}
	return batch, true
}

// handle ingests a batch until ingest succeeds, then acknowledges it. It
// returns an error when the channel closed, the batch unacknowledged; it
// returns nil when ctx ended.
func (r *run) handle(ctx context.Context, ch *amqp.Channel, closes <-chan *amqp.Error, batch []amqp.Delivery) error {
	events := make([]*ferryevent.Event, 0, len(batch))
	seen := make(map[uuid.UUID]bool, len(batch))
	var last uint64 // delivery tag of the last message to acknowledge
	for _, d := range batch {
		ev, err := Decode(d)
		if err != nil {
			r.invalid(ctx, ch, d, err)
			continue
		}
		last = d.DeliveryTag
		// A message published twice carries one event; the inbox would
		// keep the first.
		if !seen[ev.ID] {
			seen[ev.ID] = true
			events = append(events, &ev)
		}
	}
	if last == 0 {
		return nil
	}
	for attempt := 1; ; attempt++ {
		err := r.ingest(ctx, events)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil // the batch goes back to the queue when the channel closes
		}
		r.s.log.Warn("ferryrabbit: ingest failed; retrying the same batch",
			"attempt", attempt, "events", len(events), "first_id", events[0].ID, "err", err)
		t := time.NewTimer(r.retry.Delay(attempt))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		case cause := <-closes:
			t.Stop()
			return fmt.Errorf("the channel closed while ingest was retried; RabbitMQ delivers the batch again: %v", cause)
		}
	}
	if err := ch.Ack(last, true); err != nil {
		return fmt.Errorf("acknowledge ingested messages; RabbitMQ delivers them again and the inbox drops the copies: %w", err)
	}
	return nil
}

// invalid reports a message that is not a Ferry event and rejects it.
func (r *run) invalid(ctx context.Context, ch *amqp.Channel, d amqp.Delivery, err error) {
	func() {
		defer func() {
			if p := recover(); p != nil {
				r.s.log.Error("ferryrabbit: SourceConfig.OnInvalid panicked", "panic", p, "delivery_tag", d.DeliveryTag)
			}
		}()
		if r.s.cfg.OnInvalid != nil {
			r.s.cfg.OnInvalid(ctx, d, err)
			return
		}
		r.s.log.Error("ferryrabbit: message is not a Ferry event; rejecting it to the queue's dead-letter exchange, or dropping it if it has none",
			"exchange", d.Exchange, "routing_key", d.RoutingKey, "message_id", d.MessageId, "redelivered", d.Redelivered, "err", err)
	}()
	if err := ch.Reject(d.DeliveryTag, false); err != nil {
		r.s.log.Warn("ferryrabbit: reject a message that is not a Ferry event; RabbitMQ will deliver it again", "delivery_tag", d.DeliveryTag, "err", err)
	}
}

// disconnect closes the channel gracefully, so that the broker has applied
// every acknowledgement sent before, then the connection; both within
// closeTimeout plus a second.
func (r *run) disconnect(conn *amqp.Connection, ch *amqp.Channel) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		closeChannel(ch)
	}()
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		r.s.log.Warn("ferryrabbit: the channel did not close in time; closing the connection", "timeout", closeTimeout)
	}
	if err := closeConn(conn, time.Now().Add(time.Second)); err != nil {
		r.s.log.Debug("ferryrabbit: disconnect", "err", err)
	}
	<-done // closing the connection ends the channel's close
}

// System returns "rabbitmq", the broker the source reads, for telemetry
// (ferrysink.Describer): ferry.Consumer.Consume reports its deliveries
// with it.
func (s *Source) System() string { return "rabbitmq" }
