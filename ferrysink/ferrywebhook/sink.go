package ferrywebhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
	"github.com/ferry-dev/ferry/ferrysink"
)

// ErrClosed is returned for every event of a Publish call made after Close,
// and for the events of a call in progress that were not sent yet when
// Close began. The relay retries them, after a restart.
var ErrClosed = errors.New("ferrywebhook: sink is closed")

const (
	// excerptBytes is how much of an error response's body is kept for the
	// error message.
	excerptBytes = 512
	// drainBytes is how much of a response body is read and discarded so
	// that the connection can carry the next request; a longer body costs
	// the connection instead.
	drainBytes = 64 << 10
)

// Sink delivers events to an HTTP endpoint, one POST per event. It
// implements ferrysink.Sink. Create it with New; it is safe for concurrent
// use.
type Sink struct {
	cfg    *Config // WithDefaults applied
	client *http.Client
	// own is the transport New made, whose idle connections Close closes;
	// nil with Config.Client, which belongs to the caller.
	own    *http.Transport
	keys   [][]byte    // HMAC keys of Config.Secrets
	static http.Header // Config.Header, canonical names
	target string      // Config.URL, checked
	retry  backoff.Policy

	// slots holds one token per event being delivered (sending, or
	// waiting between attempts); its capacity is MaxInFlight.
	slots chan struct{}

	// mu guards closed and orders Publish's inflight.Add against Close's
	// inflight.Wait.
	mu     sync.Mutex
	closed bool
	// closing is closed when Close begins: nothing new is sent, and
	// deliveries waiting between attempts stop waiting.
	closing chan struct{}
	// inflight counts running Publish calls and delivery goroutines, which
	// can outlive the call that started them when its context ends.
	inflight sync.WaitGroup

	// abort is cancelled when Close gives up waiting; it cancels every
	// request still in flight.
	abort  context.Context
	cancel context.CancelCauseFunc

	// keyMu guards busy, which holds, for each key with a delivery running,
	// a channel closed when it ends: a key never has two requests in
	// flight, even when a call ended (its context done) before its request
	// did and the next call for the key comes in.
	keyMu sync.Mutex
	busy  map[string]chan struct{}
}

var _ ferrysink.Sink = (*Sink)(nil)

// New returns a sink delivering to the endpoint configured in cfg. It checks
// the configuration but does not contact the endpoint.
func New(cfg *Config) (*Sink, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	keys, _ := parseSecrets(c.Secrets) // checked by validate
	c.Secrets = slices.Clone(c.Secrets)
	c.TransientStatus = slices.Clone(c.TransientStatus)
	static := make(http.Header, len(c.Header))
	for name, values := range c.Header {
		for _, v := range values {
			static.Add(name, v)
		}
	}
	c.Header = static

	s := &Sink{
		cfg:     c,
		keys:    keys,
		static:  static,
		target:  c.URL,
		retry:   backoff.Policy{Base: c.RetryBase, Max: c.RetryMax},
		slots:   make(chan struct{}, c.MaxInFlight),
		closing: make(chan struct{}),
		busy:    make(map[string]chan struct{}),
	}
	if c.Client != nil {
		cl := *c.Client
		s.client = &cl
	} else {
		s.own = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          max(100, c.MaxInFlight),
			MaxIdleConnsPerHost:   c.MaxInFlight, // net/http keeps 2 by default: every other request would dial
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
		s.client = &http.Client{Transport: s.own}
	}
	s.client.Timeout = 0 // Config.Timeout applies, per attempt
	s.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	s.abort, s.cancel = context.WithCancelCause(context.Background())
	return s, nil
}

// result is the outcome of one event.
type result struct {
	index int
	err   error
}

// Publish delivers events and returns one error per event: nil once the
// endpoint answered 2xx. Events of distinct keys are sent concurrently, up to
// Config.MaxInFlight across the sink; events of one key (which the relay
// never puts in one call) one after the other, in order, and once one fails
// the later ones fail without being sent.
//
// An event fails with a ferrysink.PermanentError, without a request, when
// its payload is larger than Config.MaxBodyBytes, when Config.Endpoint
// gives it no valid URL, or when HTTP cannot carry one of its header names;
// and after a request, when the endpoint answers a status that is not 2xx
// and not retried (3xx, 4xx other than 408 and 429, unless listed in
// Config.TransientStatus). The reason holds the status and the start of the
// response body.
//
// Answers 408, 429 and 5xx, timeouts and connection failures are retried
// within the call, up to Config.MaxAttempts attempts with jittered
// exponential backoff or the wait a Retry-After header asks for, then
// returned as plain errors: the relay retries them later.
//
// When ctx is done Publish returns at once; events without an outcome get an
// error wrapping context.Cause(ctx), never a permanent one. Their requests
// are cancelled; the endpoint may still have received them. Until those
// requests end, the sink may still read the events: do not modify them
// after the call.
func (s *Sink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	return s.publish(ctx, events, nil)
}

// PublishEach implements ferrysink.EachPublisher: each event's outcome is
// reported as soon as its endpoint answers (or its retries give up), so a
// receiver that hangs for one key holds back only that key.
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

	// Group the events by key, keeping the call's order.
	var keys []string
	byKey := make(map[string][]int, len(events))
	for i, ev := range events {
		if ev == nil {
			errs[i] = errors.New("ferrywebhook: Publish was given a nil event")
			continue
		}
		if _, seen := byKey[ev.Key]; !seen {
			keys = append(keys, ev.Key)
		}
		byKey[ev.Key] = append(byKey[ev.Key], i)
	}

	results := make(chan result, len(events)) // never blocks a sender
	waiting := make([]bool, len(events))
	pending := 0
	for _, key := range keys {
		group := byKey[key]
		if err := s.acquireSlot(ctx); err != nil {
			for _, i := range group {
				errs[i] = notSent(events[i], err)
			}
			continue
		}
		for _, i := range group {
			waiting[i] = true
		}
		pending += len(group)
		s.inflight.Add(1) // safe: this call's own count keeps the counter above zero
		go s.deliverKey(ctx, events, group, results)
	}

	for pending > 0 {
		select {
		case r := <-results:
			waiting[r.index] = false
			out.Set(r.index, r.err)
			pending--
		case <-ctx.Done():
			// Keep outcomes that have already arrived, give up on the rest.
			for drained := false; !drained; {
				select {
				case r := <-results:
					waiting[r.index] = false
					out.Set(r.index, r.err)
				default:
					drained = true
				}
			}
			for i, w := range waiting {
				if w {
					errs[i] = fmt.Errorf("ferrywebhook: event %s: gave up waiting for the endpoint's answer: %w (it may have the event; the relay sends it again)",
						events[i].ID, context.Cause(ctx))
				}
			}
			pending = 0
		}
	}
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

// acquireSlot takes a slot, or returns why it could not: the call's context
// ended or the sink is closing.
func (s *Sink) acquireSlot(ctx context.Context) error {
	// Checked first: select picks at random among ready cases.
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	select {
	case <-s.closing:
		return ErrClosed
	default:
	}
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-s.closing:
		return ErrClosed
	}
}

// deliverKey delivers the events of one key (indexes into events) in order
// and reports each outcome on results. It owns a slot, which it frees.
func (s *Sink) deliverKey(ctx context.Context, events []*ferryevent.Event, group []int, results chan<- result) {
	defer s.inflight.Done()
	defer func() { <-s.slots }()

	unlock, err := s.lockKey(ctx, events[group[0]].Key)
	if err != nil {
		for _, i := range group {
			results <- result{i, notSent(events[i], err)}
		}
		return
	}
	defer unlock()

	var failed *ferryevent.Event
	for _, i := range group {
		if failed != nil {
			results <- result{i, fmt.Errorf("ferrywebhook: event %s not sent: event %s of the same key failed before it in this call", events[i].ID, failed.ID)}
			continue
		}
		err := s.deliver(ctx, events[i])
		if err != nil {
			failed = events[i]
		}
		results <- result{i, err}
	}
}

// lockKey waits until no delivery of key is running (one whose call ended
// before its request did), marks key busy and returns the function that
// frees it.
func (s *Sink) lockKey(ctx context.Context, key string) (func(), error) {
	for {
		s.keyMu.Lock()
		running, busy := s.busy[key]
		if !busy {
			done := make(chan struct{})
			s.busy[key] = done
			s.keyMu.Unlock()
			return func() {
				s.keyMu.Lock()
				delete(s.busy, key)
				s.keyMu.Unlock()
				close(done)
			}, nil
		}
		s.keyMu.Unlock()
		select {
		case <-running:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// deliver sends one event, retrying transient failures, and returns its
// outcome.
func (s *Sink) deliver(ctx context.Context, ev *ferryevent.Event) error {
	if ctx.Err() != nil {
		return notSent(ev, context.Cause(ctx))
	}
	if len(ev.Payload) > s.cfg.MaxBodyBytes {
		return ferrysink.Permanent(fmt.Sprintf("payload of %d bytes is larger than the webhook limit Config.MaxBodyBytes (%d): send a reference to the data instead, or raise the limit here and on the receivers",
			len(ev.Payload), s.cfg.MaxBodyBytes), nil)
	}
	target, err := s.endpoint(ev)
	if err != nil {
		return err
	}
	header, err := encodeHeader(ev, s.static)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			// A fresh map: the last request's may still be read by the
			// transport.
			header = header.Clone()
		}
		if err := ferrysink.Fenced(ctx); err != nil {
			return fmt.Errorf("ferrywebhook: event %s %w", ev.ID, err)
		}
		o := s.attempt(ctx, ev, target, header)
		if o.err == nil || o.final {
			return o.err
		}
		if attempt >= s.cfg.MaxAttempts {
			return fmt.Errorf("%w (gave up after %d attempts, Config.MaxAttempts; the relay retries later)", o.err, attempt)
		}
		wait := s.retry.Delay(attempt)
		if o.retryAfter >= 0 {
			wait = min(o.retryAfter, s.cfg.MaxRetryAfter)
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return fmt.Errorf("%w (attempt %d; the next one, due in %s, would come after the call's deadline)", o.err, attempt, wait.Round(time.Millisecond))
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("ferrywebhook: event %s not delivered: %w (last attempt: %v)", ev.ID, context.Cause(ctx), o.err)
		case <-s.closing:
			timer.Stop()
			return fmt.Errorf("%w (not retried: the sink is closing)", o.err)
		}
	}
}

// endpoint returns the URL ev is sent to.
func (s *Sink) endpoint(ev *ferryevent.Event) (string, error) {
	if s.cfg.Endpoint == nil {
		return s.target, nil
	}
	raw := s.cfg.Endpoint(ev)
	if raw == "" {
		return "", ferrysink.Permanent(fmt.Sprintf("Config.Endpoint gave no URL for topic %q: no route for the event", ev.Topic), nil)
	}
	if _, err := parseEndpoint(raw); err != nil {
		return "", ferrysink.Permanent(fmt.Sprintf("Config.Endpoint gave an invalid URL for topic %q: %v", ev.Topic, err), nil)
	}
	return raw, nil
}

// outcome is the result of one attempt.
type outcome struct {
	err error
	// final: do not retry (a permanent failure, the call's context ended,
	// Close gave up).
	final bool
	// retryAfter is the wait a Retry-After header asked for; < 0 when
	// there was none.
	retryAfter time.Duration
}

// attempt sends one request for ev.
func (s *Sink) attempt(ctx context.Context, ev *ferryevent.Event, target string, header http.Header) outcome {
	actx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	stop := context.AfterFunc(s.abort, cancel)
	defer stop()

	req, err := http.NewRequestWithContext(actx, http.MethodPost, target, bytes.NewReader(ev.Payload))
	if err != nil {
		return outcome{err: ferrysink.Permanent(fmt.Sprintf("cannot build a request to %s", target), err), final: true}
	}
	req.Header = header // deliver's own; attempt may set the signature headers
	id := ev.ID.String()
	ts := strconv.FormatInt(time.Now().Unix(), 10) // each attempt fresh, so a retry is never stale
	req.Header.Set(HeaderTimestamp, ts)
	if len(s.keys) > 0 {
		req.Header.Set(HeaderSignature, signature(s.keys, id, ts, ev.Payload))
	}
	where := redact(req.URL)

	resp, err := s.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL, query included
		}
		switch {
		case ctx.Err() != nil:
			return outcome{err: fmt.Errorf("ferrywebhook: event %s: the call ended during the request to %s: %w (it may have the event; the relay sends it again)", id, where, context.Cause(ctx)), final: true}
		case s.abort.Err() != nil:
			return outcome{err: fmt.Errorf("ferrywebhook: event %s: request to %s cancelled by Close: %w", id, where, ErrClosed), final: true}
		case errors.Is(actx.Err(), context.DeadlineExceeded):
			return outcome{err: fmt.Errorf("ferrywebhook: event %s: no answer from %s within Config.Timeout (%s)", id, where, s.cfg.Timeout), retryAfter: -1}
		default:
			return outcome{err: fmt.Errorf("ferrywebhook: event %s: POST %s: %w", id, where, err), retryAfter: -1}
		}
	}
	defer resp.Body.Close()
	code := resp.StatusCode
	if code >= 200 && code <= 299 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))
		return outcome{}
	}
	excerpt := readExcerpt(resp.Body)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))
	answer := fmt.Sprintf("%s answered %d %s: %q", where, code, http.StatusText(code), excerpt)

	if s.cfg.transient(code) {
		wait, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		if !ok {
			wait = -1
		}
		return outcome{err: fmt.Errorf("ferrywebhook: event %s: %s", id, answer), retryAfter: wait}
	}
	return outcome{err: ferrysink.Permanent(answer+"; "+advice(code, resp.Header.Get("Location")), nil), final: true}
}

// advice says what to do about a status that fails an event permanently.
func advice(code int, location string) string {
	switch {
	case code >= 300 && code <= 399:
		if location != "" {
			if u, err := url.Parse(location); err == nil {
				location = redact(u)
			}
			return fmt.Sprintf("redirects are not followed: point Config.URL (or Config.Endpoint; --sink-url / FERRY_SINK_URL for `ferry`) at the final address (Location: %q), then redrive the dead letters", location)
		}
		return "redirects are not followed: point Config.URL (or Config.Endpoint; --sink-url / FERRY_SINK_URL for `ferry`) at the final address, then redrive the dead letters"
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return "the endpoint refused the signature or the credentials: check Config.Secrets (FERRY_WEBHOOK_SECRETS for `ferry`) and Config.Header against the receiver's, then redrive the dead letters; list the status in Config.TransientStatus to retry instead while a rotation rolls out"
	case code == http.StatusNotFound || code == http.StatusGone:
		return "the endpoint has no route for the event: check Config.URL or Config.Endpoint (--sink-url / FERRY_SINK_URL for `ferry`), then redrive the dead letters; list the status in Config.TransientStatus to retry instead"
	case code == http.StatusRequestEntityTooLarge:
		return "the event is too large for the endpoint: send a reference to the data, or raise the receiver's body limit and redrive the dead letter"
	default:
		return "the endpoint refused the event; the relay dead-letters it (answer 5xx, 408 or 429 to have it retried)"
	}
}

// readExcerpt reads the start of an error response's body and makes it fit
// for a log line: valid UTF-8, no control characters, white space collapsed,
// at most excerptBytes bytes of the body, "…" when there was more.
func readExcerpt(body io.Reader) string {
	buf := make([]byte, excerptBytes+1)
	n, _ := io.ReadFull(body, buf)
	b := buf[:min(n, excerptBytes)]
	truncated := n > excerptBytes
	if truncated {
		// Drop a rune cut in half at the end.
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0; i++ {
			if r, size := utf8.DecodeLastRune(b); r != utf8.RuneError || size != 1 {
				break
			}
			b = b[:len(b)-1]
		}
	}
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(string(b), "\uFFFD"))
	s = strings.Join(strings.Fields(s), " ")
	if truncated {
		s += "…"
	}
	return s
}

// parseRetryAfter reads a Retry-After value: a number of seconds or an HTTP
// date. A date in the past gives 0.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseUint(v, 10, 64); err == nil {
		const limit = uint64((1<<63 - 1) / time.Second)
		return time.Duration(min(secs, limit)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// System returns "webhook", the kind of destination, for telemetry
// (ferrysink.Describer).
func (s *Sink) System() string { return "webhook" }

// Close stops sending and waits, within ctx, for the requests in flight to
// be answered; when ctx ends first, it cancels them. Events of a running
// Publish call that were not sent yet fail with ErrClosed, and deliveries
// waiting to retry return their last error. Publish must not be called
// after Close (it fails with ErrClosed); calling Close again returns nil.
// A Config.Client is left as it is; the sink's own idle connections are
// closed.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		s.inflight.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.cancel(ErrClosed)
		if s.own != nil {
			s.own.CloseIdleConnections()
		}
		return nil
	case <-ctx.Done():
		s.cancel(ErrClosed)
		if s.own != nil {
			go func() {
				<-done // soon: every request is cancelled
				s.own.CloseIdleConnections()
			}()
		}
		return fmt.Errorf("ferrywebhook: close: requests still in flight were cancelled: %w", context.Cause(ctx))
	}
}

func notSent(ev *ferryevent.Event, cause error) error {
	return fmt.Errorf("ferrywebhook: event %s not sent: %w", ev.ID, cause)
}
