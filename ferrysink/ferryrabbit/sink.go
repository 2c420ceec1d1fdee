package ferryrabbit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// ErrClosed is returned, wrapped, for the events of a Publish call made
// after Close, and for the events a call in flight had not sent yet when
// Close began.
var ErrClosed = errors.New("ferryrabbit: sink is closed")

// Sink publishes events to a RabbitMQ exchange with publisher confirms. It
// implements ferrysink.Sink. Create it with New; it is safe for concurrent
// use.
type Sink struct {
	cfg      *Config // WithDefaults applied
	log      *slog.Logger
	url      string // redacted, for messages
	maxBytes int    // Config.MaxMessageBytes, or the broker's default

	// slots holds one token per message handed to the broker and not yet
	// resolved; its capacity is MaxInFlight.
	slots chan struct{}

	// mu guards closed and active.
	mu      sync.Mutex
	closed  bool
	closing chan struct{} // closed when Close begins
	// active counts the running senders of Publish calls and the messages
	// they handed to a session and that are not resolved yet; drained is
	// closed once the sink is closed and active is zero.
	active  int
	drained chan struct{}

	// dialing is a one-token semaphore held while conn and cur change.
	dialing chan struct{}
	link    *link                   // the current connection; guarded by dialing
	cur     atomic.Pointer[session] // the session to publish on
	// watchers counts the goroutines that watch sessions and connections.
	watchers sync.WaitGroup

	// brokerMax is the broker's max_message_size, once learned from a
	// channel it closed over a message too large; 0 until then.
	brokerMax atomic.Int64
}

var _ ferrysink.Sink = (*Sink)(nil)

// New connects to the broker at Config.URL (cfg may be nil for the
// defaults), checks that Config.Exchange exists or declares it with
// Config.DeclareExchange, and opens a channel in confirm mode. It fails
// when the broker cannot be reached: check the URL before the relay starts.
// Later losses of the connection are repaired by Publish.
func New(ctx context.Context, cfg *Config) (*Sink, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	s := &Sink{
		cfg:     c,
		log:     c.Logger.With("exchange", c.Exchange),
		url:     redact(c.URL),
		slots:   make(chan struct{}, c.MaxInFlight),
		closing: make(chan struct{}),
		drained: make(chan struct{}),
		dialing: make(chan struct{}, 1),
	}
	l, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("ferryrabbit: connect to %s: %w; check Config.URL (--sink-url / FERRY_SINK_URL for `ferry`) and that RabbitMQ is running and reachable", s.url, err)
	}
	sess, err := s.start(l)
	if err != nil {
		_ = closeConn(l.conn, time.Now().Add(time.Second))
		s.watchers.Wait()
		return nil, err
	}
	s.link = l
	s.cur.Store(sess)
	return s, nil
}

// start readies a new connection: the exchange, the message size limit and
// the first session.
func (s *Sink) start(l *link) (*session, error) {
	if err := s.prepareExchange(l.conn); err != nil {
		return nil, err
	}
	s.maxBytes = s.cfg.MaxMessageBytes
	if s.maxBytes == 0 {
		s.maxBytes = defaultMaxMessageBytes(l.conn)
	}
	return s.open(l)
}

// prepareExchange declares the exchange, or checks that it exists, on a
// channel of its own: a failed check closes the channel it ran on.
func (s *Sink) prepareExchange(conn *amqp.Connection) error {
	c := s.cfg
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("ferryrabbit: open a channel on %s: %w", s.url, err)
	}
	defer closeChannel(ch)
	if c.DeclareExchange {
		err = ch.ExchangeDeclare(c.Exchange, c.ExchangeType, true, false, false, false, nil)
		switch {
		case hasCode(err, amqp.PreconditionFailed):
			return fmt.Errorf("ferryrabbit: exchange %q exists with another type or durability than Config.ExchangeType %q, durable: %w; use it as it is (unset Config.DeclareExchange; declare_exchange=false in `ferry`'s --sink-url) or choose another Config.Exchange (exchange=)", c.Exchange, c.ExchangeType, err)
		case hasCode(err, amqp.AccessRefused):
			return fmt.Errorf("ferryrabbit: declare exchange %q: %w; grant the user configure permission on it, or have it declared beforehand and unset Config.DeclareExchange (declare_exchange=false in `ferry`'s --sink-url)", c.Exchange, err)
		case hasCode(err, amqp.CommandInvalid):
			return fmt.Errorf("ferryrabbit: declare exchange %q of type %q: %w; set Config.ExchangeType to a type the broker knows (topic, direct, fanout, headers)", c.Exchange, c.ExchangeType, err)
		case err != nil:
			return fmt.Errorf("ferryrabbit: declare exchange %q: %w", c.Exchange, err)
		}
		return nil
	}
	err = ch.ExchangeDeclarePassive(c.Exchange, c.ExchangeType, true, false, false, false, nil)
	switch {
	case hasCode(err, amqp.NotFound):
		return fmt.Errorf("ferryrabbit: exchange %q not found: declare it (rabbitmqadmin declare exchange name=%s type=topic durable=true) or set Config.DeclareExchange (declare_exchange=true in `ferry`'s --sink-url): %w", c.Exchange, c.Exchange, err)
	case err != nil:
		return fmt.Errorf("ferryrabbit: look up exchange %q: %w", c.Exchange, err)
	}
	return nil
}

// result is the outcome of one event of a Publish call.
type result struct {
	index int
	err   error
}

// flight is one message handed to a session, from before it is sent until
// its outcome is known.
type flight struct {
	results chan<- result // the call's, buffered for every event
	index   int
	ev      *ferryevent.Event
	key     string // routing key
	msg     amqp.Publishing
	// Set by the session, under its mutex:
	deadline time.Time
	returned *amqp.Return
}

// Publish publishes events to Config.Exchange and returns one error per
// event: nil once RabbitMQ has confirmed it, which for a persistent message
// routed to durable queues means every queue has stored it. The messages of
// a call are sent back to back without waiting for each other's confirm, at
// most Config.MaxInFlight at a time across the sink, so the events of one
// call may be stored in any order; the relay never puts two events of one
// key in one call.
//
// An event fails with a ferrysink.PermanentError, which the relay
// dead-letters, when no queue is bound for its routing key (RabbitMQ
// returns it, since every message is published mandatory), when its
// payload is over the message size limit (checked before sending, see
// Config.MaxMessageBytes, and learned from the broker if it refuses one),
// or when AMQP 0-9-1 cannot carry it (a header name or content type longer
// than 255 bytes, headers larger than the connection's frame size, a
// routing key longer than 255 bytes). A nack, a lost connection or channel,
// a resource alarm blocking publishers and a missing confirm past
// Config.ConfirmTimeout give plain, retryable errors. The sink opens a new
// channel, or connection, for the next events.
//
// When ctx ends Publish returns at once; events without an outcome get an
// error wrapping context.Cause(ctx), never a permanent one. Those may still
// be stored: consumers deduplicate by event ID.
func (s *Sink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	return s.publish(ctx, events, nil)
}

// PublishEach implements ferrysink.EachPublisher: each event's outcome is
// reported when RabbitMQ confirms (or returns) it.
func (s *Sink) PublishEach(ctx context.Context, events []*ferryevent.Event, report func(int, error)) []error {
	return s.publish(ctx, events, report)
}

func (s *Sink) publish(ctx context.Context, events []*ferryevent.Event, report func(int, error)) []error {
	out := ferrysink.NewOutcomes(len(events), report)
	errs := out.Errs()
	if len(events) == 0 {
		return errs
	}
	if ctx.Err() != nil {
		for i, ev := range events {
			errs[i] = notSent(ctx, ev)
		}
		return out.Finish()
	}
	if !s.enter() {
		for i, ev := range events {
			errs[i] = fmt.Errorf("ferryrabbit: event %s not published: %w", ev.ID, ErrClosed)
		}
		return out.Finish()
	}
	results := make(chan result, len(events)) // never blocks a sender
	// The sender runs apart so that Publish can return when ctx ends even
	// while a write to the socket blocks.
	go s.send(ctx, events, results)

	done := make([]bool, len(events))
	for pending := len(events); pending > 0; {
		select {
		case r := <-results:
			done[r.index] = true
			out.Set(r.index, r.err)
			pending--
		case <-ctx.Done():
			// Keep the outcomes that have arrived, give up on the rest.
			for drained := false; !drained; {
				select {
				case r := <-results:
					done[r.index] = true
					out.Set(r.index, r.err)
				default:
					drained = true
				}
			}
			for i, ok := range done {
				if !ok {
					errs[i] = fmt.Errorf("ferryrabbit: event %s: no confirm from RabbitMQ before the context ended: %w (it may have been stored; consumers deduplicate by ID)",
						events[i].ID, context.Cause(ctx))
				}
			}
			pending = 0
		}
	}
	return out.Finish()
}

// enter registers the sender of a Publish call, unless the sink is closed.
func (s *Sink) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.active++
	return true
}

// hold counts one more message in flight. The caller's sender is counted
// already, so the count cannot reach zero meanwhile.
func (s *Sink) hold() {
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
}

// release ends what enter or hold counted.
func (s *Sink) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if s.active == 0 && s.closed {
		close(s.drained)
	}
}

// send hands the events of one call to the current session, one after the
// other, and reports each event that fails before it reaches the broker.
// The session reports the others.
func (s *Sink) send(ctx context.Context, events []*ferryevent.Event, results chan<- result) {
	defer s.release()
	var connErr error // once connecting failed, the rest of the call fails alike
	for i, ev := range events {
		fail := func(err error) { results <- result{i, err} }
		if ctx.Err() != nil {
			fail(notSent(ctx, ev))
			continue
		}
		if connErr != nil {
			fail(connErr)
			continue
		}
		select {
		case <-s.closing:
			fail(fmt.Errorf("ferryrabbit: event %s not published: %w", ev.ID, ErrClosed))
			continue
		default:
		}
		f, err := s.prepare(ev)
		if err != nil {
			fail(err)
			continue
		}
		f.results, f.index = results, i
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			fail(notSent(ctx, ev))
			continue
		case <-s.closing:
			fail(fmt.Errorf("ferryrabbit: event %s not published: %w", ev.ID, ErrClosed))
			continue
		}
		if err := ferrysink.Fenced(ctx); err != nil {
			<-s.slots
			fail(fmt.Errorf("ferryrabbit: event %s %w", ev.ID, err))
			continue
		}
		s.hold()
		sess, err := s.session(ctx)
		if err != nil {
			if ctx.Err() == nil {
				connErr = err
			}
			s.resolve(f, err)
			continue
		}
		if err := sess.publish(ctx, f); err != nil {
			s.resolve(f, err)
		}
	}
}

// prepare maps ev to its routing key and message, refusing what AMQP or
// the broker would refuse.
func (s *Sink) prepare(ev *ferryevent.Event) (*flight, error) {
	key := ev.Topic
	if s.cfg.RoutingKey != nil {
		key = s.cfg.RoutingKey(ev)
	}
	if len(key) > maxShortString {
		return nil, permanent(fmt.Sprintf("topic %q maps to a routing key of %d bytes; AMQP routing keys are at most %d bytes", ev.Topic, len(key), maxShortString), nil)
	}
	limit := s.maxBytes
	if b := int(s.brokerMax.Load()); b > 0 && b < limit {
		limit = b
	}
	if len(ev.Payload) > limit {
		return nil, permanent(tooLarge(len(ev.Payload), limit), nil)
	}
	msg, err := encode(ev)
	if err != nil {
		return nil, err
	}
	return &flight{ev: ev, key: key, msg: msg}, nil
}

func tooLarge(size, limit int) string {
	return fmt.Sprintf("payload too large for RabbitMQ: %d bytes, over the %d-byte message size limit (Config.MaxMessageBytes, the broker's max_message_size); publish a reference to the data instead, or raise both limits",
		size, limit)
}

// resolve reports a flight's outcome to its Publish call and frees its slot.
func (s *Sink) resolve(f *flight, err error) {
	f.results <- result{f.index, err}
	<-s.slots
	s.release()
}

// session returns the session to publish on, opening a channel, and a
// connection first if need be, when the current one is gone.
func (s *Sink) session(ctx context.Context) (*session, error) {
	if sess := s.cur.Load(); sess != nil && sess.usable() {
		return sess, nil
	}
	select {
	case s.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("ferryrabbit: not published: %w", context.Cause(ctx))
	case <-s.closing:
		return nil, fmt.Errorf("ferryrabbit: not published: %w", ErrClosed)
	}
	defer func() { <-s.dialing }()
	if sess := s.cur.Load(); sess != nil && sess.usable() {
		return sess, nil // opened while this call waited
	}
	select {
	case <-s.closing:
		return nil, fmt.Errorf("ferryrabbit: not published: %w", ErrClosed)
	default:
	}
	if s.link == nil || s.link.conn.IsClosed() {
		l, err := s.connect(ctx)
		if err != nil {
			return nil, fmt.Errorf("ferryrabbit: reconnect to %s: %w", s.url, err)
		}
		s.log.Info("ferryrabbit: reconnected to RabbitMQ", "url", s.url)
		s.link = l
	}
	sess, err := s.open(s.link)
	if err != nil {
		return nil, err
	}
	s.cur.Store(sess)
	return sess, nil
}

// open opens a channel in confirm mode on l and starts its session.
func (s *Sink) open(l *link) (*session, error) {
	ch, err := l.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("ferryrabbit: open a channel on %s: %w", s.url, err)
	}
	buf := s.cfg.MaxInFlight + 16 // never full: at most MaxInFlight messages are unresolved
	sess := &session{
		s:        s,
		ch:       ch,
		link:     l,
		frameMax: l.conn.Config.FrameSize,
		pub:      make(chan struct{}, 1),
		pending:  make(map[uint64]*flight),
		next:     1,
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, buf)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, buf)),
		closes:   ch.NotifyClose(make(chan *amqp.Error, 1)),
	}
	if err := ch.Confirm(false); err != nil {
		closeChannel(ch)
		return nil, fmt.Errorf("ferryrabbit: put the channel in confirm mode: %w; RabbitMQ supports publisher confirms, does this broker?", err)
	}
	s.watchers.Add(1)
	go sess.run()
	return sess, nil
}

// link is one connection to the broker.
type link struct {
	conn *amqp.Connection
	// blocked is the reason of the resource alarm for which RabbitMQ blocks
	// publishers on the connection, nil when publishing is allowed.
	blocked atomic.Pointer[string]
}

// connect dials the broker and starts following the connection's
// connection.blocked notifications, sent while a memory or disk alarm stops
// publishers, until it closes.
func (s *Sink) connect(ctx context.Context) (*link, error) {
	conn, err := dial(ctx, s.cfg.URL, s.cfg.AMQP, s.cfg.ConnectionName, s.cfg.DialTimeout)
	if err != nil {
		return nil, err
	}
	l := &link{conn: conn}
	notes := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	s.watchers.Add(1)
	go func() {
		defer s.watchers.Done()
		for b := range notes {
			if b.Active {
				reason := b.Reason
				l.blocked.Store(&reason)
				s.log.Warn("ferryrabbit: RabbitMQ blocks publishing on this connection until its resource alarm clears; events fail and are retried meanwhile", "reason", b.Reason)
			} else {
				l.blocked.Store(nil)
				s.log.Info("ferryrabbit: RabbitMQ unblocked publishing")
			}
		}
	}()
	return l, nil
}

// System returns "rabbitmq", the kind of destination, for telemetry
// (ferrysink.Describer).
func (s *Sink) System() string { return "rabbitmq" }

// Close waits, within ctx, for the confirms of the messages in flight (the
// events a call in flight has not sent yet fail with ErrClosed), then closes
// the connection. When ctx ends first, the connection is closed anyway and
// the unconfirmed events fail with retryable errors. Publish returns
// ErrClosed for every event afterwards; calling Close again returns nil.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	if s.active == 0 {
		close(s.drained)
	}
	s.mu.Unlock()

	var err error
	select {
	case <-s.drained:
	default:
		select {
		case <-s.drained:
		case <-ctx.Done():
			err = fmt.Errorf("ferryrabbit: close: gave up waiting for RabbitMQ's confirms of the events in flight, which fail and will be retried: %w", context.Cause(ctx))
		}
	}

	deadline := time.Now().Add(time.Second)
	if d, ok := ctx.Deadline(); ok && d.After(deadline) && ctx.Err() == nil {
		deadline = d
	}
	s.dialing <- struct{}{} // waits for a connection attempt in progress, bounded by DialTimeout
	l := s.link
	s.link = nil
	s.cur.Store(nil)
	<-s.dialing
	var conn *amqp.Connection
	if l != nil {
		conn = l.conn
	}
	if cerr := closeConn(conn, deadline); cerr != nil {
		s.log.Debug("ferryrabbit: close", "err", cerr)
	}
	// Closing the connection fails what was still in flight, which ends
	// the senders and watchers.
	<-s.drained
	s.watchers.Wait()
	return err
}

func notSent(ctx context.Context, ev *ferryevent.Event) error {
	return fmt.Errorf("ferryrabbit: event %s not published: %w", ev.ID, context.Cause(ctx))
}

func permanent(reason string, err error) error {
	return ferrysink.Permanent(reason, err)
}
