package ferryrabbit

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A session is one AMQP channel in confirm mode: it publishes flights and
// matches the broker's confirms and returns to them, and fails every flight
// in it when the channel or its connection dies.

// session is one channel in confirm mode and the messages published on it
// awaiting their confirm.
type session struct {
	s        *Sink
	ch       *amqp.Channel
	link     *link
	frameMax int

	// pub is a one-token semaphore serializing publishes, so that delivery
	// tags follow the order of registration in pending.
	pub  chan struct{}
	next uint64 // delivery tag of the next publish; guarded by pub

	mu      sync.Mutex
	dead    bool
	why     string             // why the channel ended, once dead
	pending map[uint64]*flight // by delivery tag

	confirms <-chan amqp.Confirmation
	returns  <-chan amqp.Return
	closes   <-chan *amqp.Error
}

// usable reports whether new messages may be published on the session.
func (ss *session) usable() bool {
	if ss.ch.IsClosed() {
		return false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return !ss.dead
}

// publish sends f's message. On success the session owns f and resolves it
// when its confirm (or the channel's end) arrives; on failure f is the
// caller's to resolve with the returned error.
func (ss *session) publish(ctx context.Context, f *flight) error {
	if reason := ss.link.blocked.Load(); reason != nil {
		return fmt.Errorf("ferryrabbit: event %s not published: RabbitMQ blocks publishers until its resource alarm clears (%s); free memory or disk space on the broker", f.ev.ID, *reason)
	}
	if ss.frameMax > 0 {
		if size := headerFrameSize(&f.msg); size > ss.frameMax {
			return permanent(fmt.Sprintf("headers too large: the message properties take %d bytes, more than the connection's frame size (%d bytes), which RabbitMQ cannot split; send fewer or shorter headers", size, ss.frameMax), nil)
		}
	}
	select {
	case ss.pub <- struct{}{}:
	case <-ctx.Done():
		return notSent(ctx, f.ev)
	}
	defer func() { <-ss.pub }()
	if ctx.Err() != nil {
		// Checked again once the turn came: a message must not be sent
		// after its Publish call has returned a failure for it.
		return notSent(ctx, f.ev)
	}

	tag := ss.next
	ss.mu.Lock()
	if ss.dead {
		why := ss.why
		ss.mu.Unlock()
		return fmt.Errorf("ferryrabbit: event %s not published: %s; it is retried on a new channel", f.ev.ID, why)
	}
	f.deadline = time.Now().Add(ss.s.cfg.ConfirmTimeout)
	ss.pending[tag] = f
	ss.mu.Unlock()

	err := ss.ch.Publish(ss.s.cfg.Exchange, f.key, true, false, f.msg)
	if err == nil {
		ss.next++
		return nil
	}
	if errors.Is(err, amqp.ErrClosed) {
		// The channel is closing, perhaps over this very message (RabbitMQ
		// refuses one over max_message_size as soon as its header arrives,
		// while the body is still being sent). The message stays pending:
		// the channel's end resolves it with the broker's reason, which
		// Publish does not carry, or its deadline does.
		ss.next++
		return nil
	}
	ss.mu.Lock()
	_, mine := ss.pending[tag]
	delete(ss.pending, tag)
	ss.mu.Unlock()
	if !mine {
		return nil // the channel's end resolved it already
	}
	return fmt.Errorf("ferryrabbit: publish event %s to exchange %q with routing key %q: %w", f.ev.ID, ss.s.cfg.Exchange, f.key, err)
}

// run resolves the session's messages as their confirms arrive, until the
// channel closes; then it fails those still pending.
func (ss *session) run() {
	defer ss.s.watchers.Done()
	tick := time.NewTicker(max(time.Millisecond, min(time.Second, ss.s.cfg.ConfirmTimeout/4)))
	defer tick.Stop()
	confirms, returns := ss.confirms, ss.returns
	for confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			ss.returned(r)
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			// RabbitMQ sends a message's basic.return before its
			// basic.ack, and amqp091 hands them over in that order, but
			// the select above may pick the ack first: take any return
			// already there.
			for drained := returns == nil; !drained; {
				select {
				case r, ok := <-returns:
					if !ok {
						returns = nil
						drained = true
						continue
					}
					ss.returned(r)
				default:
					drained = true
				}
			}
			ss.confirm(c)
		case now := <-tick.C:
			ss.expire(now)
		}
	}
	var cause *amqp.Error
	select {
	case cause = <-ss.closes:
	default:
	}
	ss.die(cause)
}

// returned marks the earliest pending message with r's message ID as
// returned unroutable. Its ack follows.
func (ss *session) returned(r amqp.Return) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var (
		first uint64
		f     *flight
	)
	for tag, p := range ss.pending {
		if p.returned == nil && p.msg.MessageId == r.MessageId && (f == nil || tag < first) {
			first, f = tag, p
		}
	}
	if f != nil {
		r.Body, r.Headers = nil, nil
		f.returned = &r
	}
}

func (ss *session) confirm(c amqp.Confirmation) {
	ss.mu.Lock()
	f := ss.pending[c.DeliveryTag]
	delete(ss.pending, c.DeliveryTag)
	var ret *amqp.Return
	if f != nil {
		ret = f.returned
	}
	ss.mu.Unlock()
	if f == nil {
		return // timed out earlier
	}
	switch {
	case !c.Ack:
		ss.s.resolve(f, fmt.Errorf("ferryrabbit: RabbitMQ nacked event %s (exchange %q, routing key %q): a queue refused it (a full queue with overflow reject-publish) or the broker failed to store it; it is retried",
			f.ev.ID, ss.s.cfg.Exchange, f.key))
	case ret != nil:
		ss.s.resolve(f, permanent(fmt.Sprintf("no queue is bound for routing key %q on exchange %q (RabbitMQ returned the message: %d %s); bind a queue with a matching binding key, or map the topic elsewhere with Config.RoutingKey",
			f.key, ss.s.cfg.Exchange, ret.ReplyCode, ret.ReplyText), nil))
	default:
		ss.s.resolve(f, nil)
	}
}

// expire fails the messages whose confirm is overdue.
func (ss *session) expire(now time.Time) {
	var late []*flight
	ss.mu.Lock()
	for tag, f := range ss.pending {
		if now.After(f.deadline) {
			late = append(late, f)
			delete(ss.pending, tag)
		}
	}
	ss.mu.Unlock()
	for _, f := range late {
		ss.s.resolve(f, fmt.Errorf("ferryrabbit: event %s: no confirm from RabbitMQ within Config.ConfirmTimeout (%s); it may have been stored and is retried", f.ev.ID, ss.s.cfg.ConfirmTimeout))
	}
}

// die fails every pending message after the channel closed with cause
// (nil when closed by the sink). A message whose confirm never came may or
// may not be stored: the relay publishes it again and consumers
// deduplicate.
func (ss *session) die(cause *amqp.Error) {
	limit := tooLargeLimit(cause)
	if limit > 0 {
		ss.s.brokerMax.Store(int64(limit))
	}
	var why string
	switch {
	case cause == nil:
		why = "the sink closed the channel"
	case limit > 0:
		why = fmt.Sprintf("RabbitMQ closed the channel over a message larger than its max_message_size (%d bytes) (%s); lower Config.MaxMessageBytes to it", limit, cause.Reason)
	case cause.Code == amqp.NotFound:
		why = fmt.Sprintf("RabbitMQ closed the channel: %s; was exchange %q deleted? Declare it again, or set Config.DeclareExchange and restart", cause.Reason, ss.s.cfg.Exchange)
	case cause.Code == amqp.AccessRefused:
		why = fmt.Sprintf("RabbitMQ closed the channel: %s; grant the user write permission on exchange %q", cause.Reason, ss.s.cfg.Exchange)
	default:
		why = fmt.Sprintf("the connection or channel to RabbitMQ was lost: %s", cause.Error())
	}
	ss.mu.Lock()
	ss.dead, ss.why = true, why
	pending := ss.pending
	ss.pending = nil
	ss.mu.Unlock()

	if cause != nil && len(pending) > 0 {
		ss.s.log.Warn("ferryrabbit: channel closed with messages awaiting their confirm; they fail and are retried", "unconfirmed", len(pending), "cause", cause.Error())
	}
	for _, f := range pending {
		if limit > 0 && len(f.ev.Payload) > limit {
			ss.s.resolve(f, permanent(tooLarge(len(f.ev.Payload), limit), cause))
			continue
		}
		ss.s.resolve(f, fmt.Errorf("ferryrabbit: event %s: no confirm from RabbitMQ: %s; it may have been stored and is retried", f.ev.ID, why))
	}
}

// tooLargeRE matches the reason RabbitMQ gives when it closes a channel
// over a message larger than max_message_size.
var tooLargeRE = regexp.MustCompile(`message size (\d+) is larger than (?:configured )?max size (\d+)`)

// tooLargeLimit returns the max_message_size named by cause, or 0 when
// cause is not about a message too large.
func tooLargeLimit(cause *amqp.Error) int {
	if cause == nil || cause.Code != amqp.PreconditionFailed {
		return 0
	}
	m := tooLargeRE.FindStringSubmatch(cause.Reason)
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[2])
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
