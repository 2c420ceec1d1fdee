package ferrywebhook

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Defaults applied by Config.WithDefaults.
const (
	// DefaultTimeout bounds one HTTP request, from dialling to the end of
	// the response.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxAttempts is how many requests Publish makes for one event
	// before it hands a transient failure back to the relay.
	DefaultMaxAttempts = 3
	// DefaultRetryBase and DefaultRetryMax bound the jittered exponential
	// backoff between those attempts.
	DefaultRetryBase = 100 * time.Millisecond
	DefaultRetryMax  = 2 * time.Second
	// DefaultMaxRetryAfter caps the wait a Retry-After header can ask for.
	DefaultMaxRetryAfter = 10 * time.Second
	// DefaultMaxInFlight bounds the events being delivered at once.
	DefaultMaxInFlight = 64
	// DefaultMaxBodyBytes is the largest payload sent: 1 MiB, Ferry's
	// default payload limit (ferryevent.DefaultMaxPayloadBytes), so that
	// an event the outbox accepted with default settings is never refused
	// here, and the body limit of Handler.
	DefaultMaxBodyBytes = ferryevent.DefaultMaxPayloadBytes
)

// Config configures a Sink. URL (or Endpoint) and Secrets (or Unsigned) are
// required; every other field has a default.
type Config struct {
	// URL is the endpoint every event is POSTed to: an absolute http or
	// https URL. Redirects are not followed, so give the final address.
	// Set URL or Endpoint, not both.
	URL string

	// Endpoint, when set, replaces URL: it returns the URL for an event,
	// for example one path per topic. It must be safe for concurrent use.
	// An event for which it returns "" or something that is not an
	// absolute http(s) URL fails permanently: it has no route.
	Endpoint func(ev *ferryevent.Event) string

	// Secrets sign every request, in the Standard Webhooks form: each is
	// "whsec_" followed by the base64 encoding of at least 24 random bytes
	// (NewSecret makes one). With several, each request carries one
	// signature per secret, which is how secrets are rotated: add the new
	// one here, move the receivers to it, then remove the old one.
	Secrets []string

	// Unsigned, when true, sends requests without webhook-signature. Only
	// for endpoints that authenticate the sender otherwise (mutual TLS, a
	// private network). Secrets must then be empty.
	Unsigned bool

	// Header holds headers added to every request, such as Authorization.
	// Names Ferry writes (Content-Type, ce-*, webhook-*, Ferry-Headers) and
	// names HTTP manages (Host, Content-Length, Connection, ...) are
	// refused by New. An event header with the same name as one of these
	// is not sent: an event cannot replace the sink's credentials.
	Header http.Header

	// Client, when set, sends the requests; use it for a proxy, custom TLS
	// or mutual TLS. The sink uses a copy that never follows redirects and
	// ignores Client.Timeout (Timeout applies instead). Default: a client
	// of its own, keeping up to MaxInFlight connections per host alive.
	Client *http.Client

	// Timeout bounds one request, from connecting to reading the response;
	// past it the attempt counts as a transient failure. Default:
	// DefaultTimeout.
	Timeout time.Duration

	// MaxAttempts is how many requests Publish makes for one event before
	// it returns the last transient failure to the relay, which retries
	// later with its own backoff. 1 disables retries within Publish.
	// Default: DefaultMaxAttempts.
	MaxAttempts int

	// RetryBase and RetryMax bound the jittered exponential backoff
	// between attempts. Defaults: DefaultRetryBase and DefaultRetryMax.
	RetryBase, RetryMax time.Duration

	// MaxRetryAfter caps the wait a Retry-After header (seconds or an
	// HTTP date, on any transient answer) can impose before the next
	// attempt; a longer request waits MaxRetryAfter. Default:
	// DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration

	// TransientStatus lists status codes to retry besides 408, 429 and
	// 5xx. Every other status that is not 2xx fails the event permanently
	// (the relay dead-letters it); add 401 and 403 here while a secret
	// rotation rolls out, or 404 while receivers are being deployed.
	TransientStatus []int

	// MaxInFlight bounds the events being delivered at once across all
	// Publish calls, counting those waiting between attempts. Default:
	// DefaultMaxInFlight.
	MaxInFlight int

	// MaxBodyBytes is the largest payload sent; a larger event fails
	// permanently without a request. Default: DefaultMaxBodyBytes.
	MaxBodyBytes int
}

// WithDefaults returns a copy of c (which may be nil) with every unset field
// set to its default.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&out.Timeout, DefaultTimeout)
	def(&out.RetryBase, DefaultRetryBase)
	def(&out.RetryMax, DefaultRetryMax)
	def(&out.MaxRetryAfter, DefaultMaxRetryAfter)
	if out.MaxAttempts == 0 {
		out.MaxAttempts = DefaultMaxAttempts
	}
	if out.MaxInFlight == 0 {
		out.MaxInFlight = DefaultMaxInFlight
	}
	if out.MaxBodyBytes == 0 {
		out.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return &out
}

// validate checks a Config that went through WithDefaults.
func (c *Config) validate() error {
	switch {
	case c.URL == "" && c.Endpoint == nil:
		return errors.New("ferrywebhook: Config.URL is empty; set it to the receiver's https URL (--sink-url / FERRY_SINK_URL for `ferry`), or set Config.Endpoint to route each event")
	case c.URL != "" && c.Endpoint != nil:
		return errors.New("ferrywebhook: both Config.URL and Config.Endpoint are set; keep one (Endpoint may return a fixed URL for most events)")
	case c.URL != "":
		if _, err := parseEndpoint(c.URL); err != nil {
			return fmt.Errorf("ferrywebhook: Config.URL: %w", err)
		}
	}
	switch {
	case len(c.Secrets) == 0 && !c.Unsigned:
		return errors.New("ferrywebhook: Config.Secrets is empty (FERRY_WEBHOOK_SECRETS for `ferry`); generate one with ferrywebhook.NewSecret and give it to the receivers, or set Config.Unsigned (FERRY_WEBHOOK_UNSIGNED=true) for an endpoint authenticated otherwise")
	case len(c.Secrets) > 0 && c.Unsigned:
		return errors.New("ferrywebhook: Config.Unsigned (FERRY_WEBHOOK_UNSIGNED for `ferry`) is set but Config.Secrets (FERRY_WEBHOOK_SECRETS) is not empty; remove one of them")
	}
	if _, err := parseSecrets(c.Secrets); err != nil {
		return fmt.Errorf("ferrywebhook: Config.Secrets: %w", err)
	}
	for name, values := range c.Header {
		if !ferryevent.IsToken(name) {
			return fmt.Errorf("ferrywebhook: Config.Header: %q is not a valid HTTP header name", name)
		}
		if reservedHeader(strings.ToLower(name)) {
			return fmt.Errorf("ferrywebhook: Config.Header: %q is written by Ferry or by HTTP itself; remove it (Content-Type comes from Event.ContentType, the target from Config.URL)", name)
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				return fmt.Errorf("ferrywebhook: Config.Header: the value of %q contains a control character (CR, LF, ...); remove it", name)
			}
		}
	}
	switch {
	case c.Timeout < 0:
		return fmt.Errorf("ferrywebhook: Config.Timeout is %s; set it > 0, or 0 for %s", c.Timeout, DefaultTimeout)
	case c.MaxAttempts < 0:
		return fmt.Errorf("ferrywebhook: Config.MaxAttempts is %d; set it >= 1 (1: no retry within Publish), or 0 for %d", c.MaxAttempts, DefaultMaxAttempts)
	case c.RetryBase < 0 || c.RetryMax < c.RetryBase:
		return fmt.Errorf("ferrywebhook: Config.RetryBase (%s) must be positive and at most Config.RetryMax (%s); 0 gives the defaults %s and %s", c.RetryBase, c.RetryMax, DefaultRetryBase, DefaultRetryMax)
	case c.MaxRetryAfter < 0:
		return fmt.Errorf("ferrywebhook: Config.MaxRetryAfter is %s; set it > 0, or 0 for %s", c.MaxRetryAfter, DefaultMaxRetryAfter)
	case c.MaxInFlight < 0:
		return fmt.Errorf("ferrywebhook: Config.MaxInFlight is %d; set it > 0, or 0 for %d", c.MaxInFlight, DefaultMaxInFlight)
	case c.MaxBodyBytes < 0:
		return fmt.Errorf("ferrywebhook: Config.MaxBodyBytes is %d; set it > 0, or 0 for %d", c.MaxBodyBytes, DefaultMaxBodyBytes)
	}
	for _, code := range c.TransientStatus {
		if code < 300 || code > 599 {
			return fmt.Errorf("ferrywebhook: Config.TransientStatus holds %d; list status codes from 300 to 599 (2xx always succeeds)", code)
		}
	}
	return nil
}

// transient reports whether an answer with this status is retried.
func (c *Config) transient(status int) bool {
	switch {
	case status == http.StatusRequestTimeout, status == http.StatusTooManyRequests:
		return true
	case status >= 500 && status <= 599:
		return true
	}
	return slices.Contains(c.TransientStatus, status)
}

// parseEndpoint parses an absolute http or https URL.
func parseEndpoint(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New("empty URL")
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL, credentials included
		}
		return nil, fmt.Errorf("not a valid URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%q is not an http or https URL; write it as https://host/path", redact(u))
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%q has no host; write it as https://host/path", redact(u))
	}
	return u, nil
}

// redact returns u without its user information, query and fragment, which
// may hold credentials, for error messages and dead-letter reasons.
func redact(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.ForceQuery, c.Fragment, c.RawFragment = nil, "", false, "", ""
	return c.String()
}
