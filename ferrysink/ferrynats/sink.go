package ferrynats

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// ErrClosed is returned for every event of a Publish call made after Close.
var ErrClosed = errors.New("ferrynats: sink is closed")

// errCodeStreamNotMatch is JetStream's error code for a message whose
// Nats-Expected-Stream names another stream than the one capturing its
// subject ("expected stream does not match"). nats.go has no constant for it.
const errCodeStreamNotMatch jetstream.ErrorCode = 10060

// Sink publishes events to a JetStream stream. It implements
// ferrysink.Sink. Create it with New; it is safe for concurrent use.
type Sink struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	cfg   *Config               // WithDefaults applied
	guard *ferrysink.WriteGuard // nil unless nc was made with WriteFence

	// slots holds one token per message published and not yet resolved
	// (acknowledged, failed or timed out); its capacity is MaxInFlight.
	slots chan struct{}

	// mu guards closed and orders Publish's inflight.Add against Close's
	// inflight.Wait.
	mu     sync.Mutex
	closed bool
	// inflight counts running Publish calls and unresolved messages.
	inflight sync.WaitGroup

	// duplicates counts acks with Duplicate set: messages JetStream dropped
	// because it already stored their Nats-Msg-Id.
	duplicates atomic.Uint64
}

var (
	_ ferrysink.Sink              = (*Sink)(nil)
	_ ferrysink.DuplicateReporter = (*Sink)(nil)
)

// Duplicates implements ferrysink.DuplicateReporter: the number of
// published messages JetStream acknowledged as duplicates of a message it
// had already stored within the stream's duplicate window.
func (s *Sink) Duplicates() uint64 { return s.duplicates.Load() }

// New returns a sink publishing through nc, an open connection the caller
// owns and closes after the sink. It looks up the configured stream (cfg
// may be nil for the defaults), creating it when Config.CreateStream is set,
// and checks that it captures the subjects "<SubjectPrefix>.>" unless
// Config.Subject replaces the prefix mapping.
func New(ctx context.Context, nc *nats.Conn, cfg *Config) (*Sink, error) {
	if nc == nil {
		return nil, errors.New("ferrynats: New needs a connection: pass the *nats.Conn returned by nats.Connect")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if nc.IsClosed() {
		return nil, errors.New("ferrynats: the NATS connection is closed; pass an open connection and close it after the sink")
	}
	if nc.IsConnected() && !nc.HeadersSupported() {
		return nil, errors.New("ferrynats: the NATS server does not support message headers; Ferry needs nats-server 2.2 or later")
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(c.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(c.AckTimeout),
	)
	if err != nil {
		return nil, fmt.Errorf("ferrynats: set up JetStream: %w", err)
	}
	if err := checkStream(ctx, js, c); err != nil {
		return nil, err
	}
	return &Sink{
		nc:    nc,
		js:    js,
		cfg:   c,
		slots: make(chan struct{}, c.MaxInFlight),
		guard: guardOf(nc),
	}, nil
}

// createStream creates the configured stream, again (three times in all,
// 100 ms apart) when the server failed to create its store: nats-server
// can race its own removal of an empty account directory when streams are
// deleted and created at once (API error 10049, "error creating store for
// stream").
const errCodeStreamStoreFailed jetstream.ErrorCode = 10049 // NATS server: JSStreamStoreFailedF

func createStream(ctx context.Context, js jetstream.JetStream, c *Config) (jetstream.Stream, error) {
	for attempt := 1; ; attempt++ {
		stream, err := js.CreateStream(ctx, c.streamConfig())
		var apiErr *jetstream.APIError
		if attempt == 3 || !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeStreamStoreFailed {
			return stream, err
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return nil, err
		}
	}
}

// checkStream finds (or creates) the configured stream and checks that it
// captures the prefix mapping's subjects.
func checkStream(ctx context.Context, js jetstream.JetStream, c *Config) error {
	stream, err := js.Stream(ctx, c.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && !c.CreateStream:
		return fmt.Errorf("ferrynats: stream %q not found: create stream %s with subjects %q (nats stream add %s --subjects '%s' --storage file --dupe-window 2m) or set Config.CreateStream (--create-stream / FERRY_CREATE_STREAM for `ferry`): %w",
			c.Stream, c.Stream, c.prefixSubjects(), c.Stream, c.prefixSubjects(), err)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		stream, err = createStream(ctx, js, c)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Created meanwhile by another process: use it as it is.
			stream, err = js.Stream(ctx, c.Stream)
		}
		if err != nil {
			return fmt.Errorf("ferrynats: create stream %q: %w", c.Stream, err)
		}
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("ferrynats: look up stream %q: %w; enable JetStream on the server (nats-server -js) and for the account", c.Stream, err)
	case err != nil:
		return fmt.Errorf("ferrynats: look up stream %q: %w", c.Stream, err)
	}

	if c.Subject != nil {
		return nil // The mapping is the caller's; publishing will tell.
	}
	subjects := stream.CachedInfo().Config.Subjects
	for _, s := range subjects {
		if covers(s, c.prefixSubjects()) {
			return nil
		}
	}
	return fmt.Errorf("ferrynats: stream %q does not capture the subjects %q (its subjects: %s): add %q to the stream's subjects, set Config.SubjectPrefix (--subject-prefix / FERRY_SUBJECT_PREFIX for `ferry`) to a prefix it captures, or map topics yourself with Config.Subject",
		c.Stream, c.prefixSubjects(), quoteList(subjects), c.prefixSubjects())
}

// ackResult is the outcome of one asynchronous publish.
type ackResult struct {
	index int
	ack   *jetstream.PubAck
	err   error
}

// Publish publishes events to JetStream and returns one error per event:
// nil once the stream has acknowledged it (a copy the stream drops as a
// duplicate of an ID it stored within its duplicate window counts as
// acknowledged). Messages are published asynchronously, at most
// Config.MaxInFlight at a time, so the events of one call may be stored in
// any order; the relay never puts two events of one key in the same call.
//
// An event fails with a ferrysink.PermanentError when it is larger than the
// server's max_payload or the stream's max_msg_size, when its subject is
// invalid or captured by no stream or by another stream than Config.Stream,
// when a header name cannot be carried by NATS, or when JetStream rejects
// the message as a bad request. Timeouts, disconnections and a stream that
// exists but does not answer give plain, retryable errors.
//
// When ctx is done Publish returns at once; events without an outcome get
// an error wrapping context.Cause(ctx). Those may still be stored: a retry within the
// duplicate window is dropped by JetStream.
func (s *Sink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	return s.publish(ctx, events, nil)
}

// PublishEach implements ferrysink.EachPublisher: each acknowledgement is
// reported as it arrives; failures when the call ends.
func (s *Sink) PublishEach(ctx context.Context, events []*ferryevent.Event, done func(int, error)) []error {
	return s.publish(ctx, events, done)
}

func (s *Sink) publish(ctx context.Context, events []*ferryevent.Event, done func(int, error)) []error {
	out := ferrysink.NewOutcomes(len(events), done)
	errs := out.Errs()
	if len(events) == 0 {
		return errs
	}
	if !s.enter() {
		for i := range errs {
			errs[i] = ErrClosed
		}
		return out.Finish()
	}
	defer s.inflight.Done()

	subjects := make([]string, len(events))
	waiting := make([]bool, len(events))
	pending := 0
	results := make(chan ackResult, len(events)) // never blocks a sender
	guarded := s.guard.Call(ctx)                 // only checks the fence without WriteFence
	for i, ev := range events {
		if ctx.Err() != nil {
			errs[i] = notSent(ctx, ev)
			continue
		}
		msg, err := s.message(ev)
		if err != nil {
			errs[i] = err
			continue
		}
		subjects[i] = msg.Subject
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			errs[i] = notSent(ctx, ev)
			continue
		}
		dropped, err := guarded.Arm()
		if err != nil {
			<-s.slots
			errs[i] = fmt.Errorf("ferrynats: event %s %w", ev.ID, err)
			continue
		}
		paf, err := s.js.PublishMsgAsync(msg)
		if err != nil {
			guarded.Disarm()
			<-s.slots
			errs[i] = s.classify(ev, msg.Subject, err)
			continue
		}
		guarded.Queued()
		waiting[i] = true
		pending++
		s.inflight.Add(1) // safe: this call's own count keeps the counter above zero
		go s.await(i, paf, dropped, results)
	}

	record := func(r ackResult) {
		waiting[r.index] = false
		pending--
		if r.err == nil {
			r.err = s.checkAck(subjects[r.index], r.ack)
			if r.err == nil && r.ack.Duplicate {
				s.duplicates.Add(1)
			}
		}
		if r.err != nil {
			// Reported when the call ends: explainNoResponders may say more.
			errs[r.index] = s.classify(events[r.index], subjects[r.index], r.err)
			return
		}
		out.Set(r.index, nil)
	}
	for pending > 0 {
		select {
		case r := <-results:
			record(r)
		case <-ctx.Done():
			// Keep outcomes that have already arrived, give up on the rest.
			for drained := false; !drained && pending > 0; {
				select {
				case r := <-results:
					record(r)
				default:
					drained = true
				}
			}
			for i, w := range waiting {
				if w {
					errs[i] = fmt.Errorf("ferrynats: publish event %s to %s: gave up waiting for the JetStream ack: %w (the event may be stored; a retry within the duplicate window is dropped as a duplicate)",
						events[i].ID, subjects[i], context.Cause(ctx))
				}
			}
			pending = 0
		}
	}

	s.explainNoResponders(ctx, subjects, errs)
	return out.Finish()
}

// enter registers a Publish call, unless the sink is closed.
func (s *Sink) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.inflight.Add(1)
	return true
}

// await waits for one message's outcome and frees its slot. It does not
// watch the caller's context: the slot stays taken until JetStream answers
// or Config.AckTimeout passes, which always happens. When the write guard
// drops a write meanwhile (dropped is closed), the outcome is reported at
// once and the slot is freed when nats.go gives up on the message.
func (s *Sink) await(index int, paf jetstream.PubAckFuture, dropped <-chan struct{}, results chan<- ackResult) {
	defer s.inflight.Done()
	r := ackResult{index: index}
	select {
	case r.ack = <-paf.Ok():
	case r.err = <-paf.Err():
		select {
		case <-dropped:
			// The guard refused a write, which closed the connection, and
			// nats.go failed the message ("server is disconnected") before
			// this select saw the drop: the refusal is the outcome.
			r.err = errAckDropped
		default:
		}
	case <-dropped:
		r.err = errAckDropped
		results <- r
		select {
		case <-paf.Ok():
		case <-paf.Err():
		}
		<-s.slots
		return
	}
	<-s.slots
	results <- r
}

// message maps ev to its subject and encodes it, refusing what NATS would
// refuse.
func (s *Sink) message(ev *ferryevent.Event) (*nats.Msg, error) {
	var subject string
	switch {
	case s.cfg.Subject != nil:
		subject = s.cfg.Subject(ev)
	case s.cfg.Shares > 1:
		subject = shareSubject(s.cfg.SubjectPrefix, ferrydriver.PartitionOf(ev.Key, s.cfg.Shares), ev.Topic)
	default:
		subject = s.cfg.SubjectPrefix + "." + ev.Topic
	}
	if reason := invalidSubject(subject); reason != "" {
		return nil, permanent(fmt.Sprintf("topic %q maps to subject %q, which is not a valid NATS subject: %s", ev.Topic, subject, reason), nil)
	}
	msg, err := encode(ev, subject, s.cfg.Stream)
	if err != nil {
		return nil, err
	}
	// The server's limit applies to headers and data together.
	limit := s.nc.MaxPayload()
	if size := int64(msg.Size() - len(msg.Subject)); limit > 0 && size > limit {
		return nil, permanent(fmt.Sprintf("payload too large for NATS max_payload (%d bytes): %d bytes of payload and %d of headers; publish a reference to the data instead, or raise max_payload on the server",
			limit, len(msg.Data), size-int64(len(msg.Data))), nats.ErrMaxPayload)
	}
	return msg, nil
}

// checkAck verifies that the ack comes from the configured stream.
func (s *Sink) checkAck(subject string, ack *jetstream.PubAck) error {
	if ack == nil {
		return jetstream.ErrInvalidJSAck
	}
	if ack.Stream != s.cfg.Stream {
		return permanent(wrongStream(subject, ack.Stream, s.cfg.Stream), nil)
	}
	return nil
}

// classify turns a publish failure into the error reported for ev:
// a ferrysink.PermanentError when retrying cannot help, a plain error
// otherwise. jetstream.ErrNoStreamResponse is kept as is for
// explainNoResponders.
func (s *Sink) classify(ev *ferryevent.Event, subject string, err error) error {
	var apiErr *jetstream.APIError
	isAPI := errors.As(err, &apiErr)
	switch {
	case ferrysink.IsPermanent(err), errors.Is(err, jetstream.ErrNoStreamResponse):
		return err
	case errors.Is(err, nats.ErrMaxPayload):
		return permanent(fmt.Sprintf("payload too large for NATS max_payload (%d bytes); publish a reference to the data instead, or raise max_payload on the server", s.nc.MaxPayload()), err)
	case isAPI && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return permanent(fmt.Sprintf("message larger than the max_msg_size of stream %q; publish a reference to the data instead, or raise the stream's limit", s.cfg.Stream), err)
	case isAPI && apiErr.ErrorCode == errCodeStreamNotMatch:
		return permanent(wrongStream(subject, "", s.cfg.Stream), err)
	case errors.Is(err, nats.ErrBadSubject):
		return permanent(fmt.Sprintf("subject %q is not a valid NATS subject", subject), err)
	case errors.Is(err, nats.ErrBadHeaderMsg):
		return permanent("a header cannot be carried by NATS", err)
	case isAPI && apiErr.Code == http.StatusBadRequest:
		return permanent("JetStream rejected the message: "+apiErr.Description, err)
	case errors.Is(err, nats.ErrReconnectBufExceeded):
		return fmt.Errorf("ferrynats: event %s not published to %s: the connection to NATS is down and being re-established: %w", ev.ID, subject, err)
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout):
		return fmt.Errorf("ferrynats: publish event %s to %s: no ack within Config.AckTimeout (%s): %w", ev.ID, subject, s.cfg.AckTimeout, err)
	default:
		return fmt.Errorf("ferrynats: publish event %s to %s: %w", ev.ID, subject, err)
	}
}

// explainNoResponders replaces jetstream.ErrNoStreamResponse (nothing
// answered on the subject, even after nats.go's retries) with a verdict:
// permanent when no stream, or another stream than Config.Stream, captures
// the subject; retryable when the stream captures it but did not answer, as
// during a leader election. It asks the server once per subject.
func (s *Sink) explainNoResponders(ctx context.Context, subjects []string, errs []error) {
	verdicts := make(map[string]error)
	for i, err := range errs {
		if err == nil || ferrysink.IsPermanent(err) || !errors.Is(err, jetstream.ErrNoStreamResponse) {
			continue
		}
		subject := subjects[i]
		verdict, ok := verdicts[subject]
		if !ok {
			verdict = s.noResponders(ctx, subject)
			verdicts[subject] = verdict
		}
		errs[i] = verdict
	}
}

func (s *Sink) noResponders(ctx context.Context, subject string) error {
	name, err := s.js.StreamNameBySubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return permanent(fmt.Sprintf("no JetStream stream captures subject %q: add it to the subjects of stream %q, or change the mapping (Config.SubjectPrefix, --subject-prefix / FERRY_SUBJECT_PREFIX for `ferry`, or Config.Subject)", subject, s.cfg.Stream), jetstream.ErrNoStreamResponse)
	case err != nil:
		return fmt.Errorf("ferrynats: no stream answered on subject %q, and looking up the stream that captures it failed: %w", subject, errors.Join(jetstream.ErrNoStreamResponse, err))
	case name != s.cfg.Stream:
		return permanent(wrongStream(subject, name, s.cfg.Stream), jetstream.ErrNoStreamResponse)
	default:
		return fmt.Errorf("ferrynats: stream %q captures subject %q but did not answer; it may be electing a leader or be offline: %w", name, subject, jetstream.ErrNoStreamResponse)
	}
}

// System returns "nats", the kind of destination, for telemetry
// (ferrysink.Describer).
func (s *Sink) System() string { return "nats" }

// Close waits, within ctx, for the acknowledgements of messages already
// published, then stops listening for acknowledgements. It leaves the
// connection open: the caller owns it. Publish must not be called after
// Close; calling Close again returns nil.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		s.inflight.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("ferrynats: close: messages still awaiting JetStream acks were abandoned: %w", context.Cause(ctx))
	}
	// Fails whatever is still pending, which ends the goroutine above.
	s.js.CleanupPublisher()
	return err
}

func notSent(ctx context.Context, ev *ferryevent.Event) error {
	return fmt.Errorf("ferrynats: event %s not published: %w", ev.ID, context.Cause(ctx))
}

func wrongStream(subject, got, want string) string {
	if got == "" {
		return fmt.Sprintf("subject %q is captured by another stream than %q: map the topic to a subject of %q, or set Config.Stream (--stream / FERRY_STREAM for `ferry`) to the stream that captures it", subject, want, want)
	}
	return fmt.Sprintf("subject %q is captured by stream %q, not the configured %q: map the topic to a subject of %q, or set Config.Stream (--stream / FERRY_STREAM for `ferry`) to %q", subject, got, want, want, got)
}

func permanent(reason string, err error) error {
	return ferrysink.Permanent(reason, err)
}

func quoteList(ss []string) string {
	if len(ss) == 0 {
		return "none"
	}
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}
