package ferrynats

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Defaults applied by Config.WithDefaults.
const (
	DefaultSubjectPrefix = "ferry"
	DefaultStream        = "FERRY"
	DefaultMaxInFlight   = 256
	DefaultAckTimeout    = 5 * time.Second
	// DefaultDuplicateWindow is the duplicate window of a stream created by
	// New: a republished event is dropped by JetStream if its first copy
	// was stored less than this long ago.
	DefaultDuplicateWindow = 2 * time.Minute
)

// Config configures a Sink. The zero value (or a nil *Config) publishes
// events on topic T to subject "ferry.T" in the existing stream "FERRY".
type Config struct {
	// SubjectPrefix maps an event to the subject "<SubjectPrefix>.<Topic>".
	// It must be a valid subject without wildcards, such as "ferry" or
	// "acme.events". Default: DefaultSubjectPrefix. Ignored when Subject
	// is set, except for the subjects of a stream created by New.
	SubjectPrefix string

	// Subject, when set, replaces the prefix mapping: it returns the
	// subject for an event. It must be safe for concurrent use and must
	// return a subject the stream captures; New cannot check that, so an
	// unrouted subject shows up at publish time as a permanent failure.
	Subject func(ev *ferryevent.Event) string

	// Shares, when above 1, divides the subjects into that many shares
	// for consumers spread over replicas: an event goes to
	// "<SubjectPrefix>.<share>.<Topic>", its share the key's hash modulo
	// Shares (ferrydriver.PartitionOf: with as many shares as outbox
	// partitions, a share holds a partition's keys). A Source with the same
	// SourceConfig.Shares reads each share through a durable of its own.
	// Choose it once, at least the most replicas that will consume: a key
	// changes share when it changes. Not with Subject.
	Shares int

	// Stream names the JetStream stream expected to capture the subjects.
	// Every message carries it in Nats-Expected-Stream, so a subject
	// captured by another stream fails instead of landing there.
	// Default: DefaultStream.
	Stream string

	// CreateStream makes New create Stream when it does not exist, with
	// StreamConfig or else subjects "<SubjectPrefix>.>", file storage and
	// a DefaultDuplicateWindow duplicate window. An existing stream is
	// never changed. When false, New fails if the stream is missing.
	CreateStream bool

	// StreamConfig, when set, is the configuration New creates the stream
	// with (only with CreateStream). Its Name may be empty, in which case
	// Stream is used, or must equal Stream; empty Subjects default to
	// "<SubjectPrefix>.>". Keep Duplicates long enough for the relay's
	// retries: JetStream deduplicates only within it.
	StreamConfig *jetstream.StreamConfig

	// MaxInFlight bounds the messages published and not yet acknowledged,
	// across all Publish calls of the sink. A Publish call that reaches the
	// bound waits for acknowledgements. Default: DefaultMaxInFlight.
	MaxInFlight int

	// AckTimeout bounds the wait for JetStream's acknowledgement of one
	// message; past it the event fails with a retryable error. Default:
	// DefaultAckTimeout.
	AckTimeout time.Duration
}

// WithDefaults returns a copy of c (which may be nil) with every unset field
// set to its default.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.SubjectPrefix == "" {
		out.SubjectPrefix = DefaultSubjectPrefix
	}
	if out.Stream == "" {
		out.Stream = DefaultStream
	}
	if out.MaxInFlight == 0 {
		out.MaxInFlight = DefaultMaxInFlight
	}
	if out.AckTimeout == 0 {
		out.AckTimeout = DefaultAckTimeout
	}
	return &out
}

// validate checks a Config that went through WithDefaults.
func (c *Config) validate() error {
	if reason := invalidSubject(c.SubjectPrefix); reason != "" {
		return fmt.Errorf("ferrynats: Config.SubjectPrefix (--subject-prefix / FERRY_SUBJECT_PREFIX for `ferry`) %q is not a valid subject prefix: %s", c.SubjectPrefix, reason)
	}
	if strings.ContainsAny(c.Stream, " \t\r\n.*>/\\") {
		return fmt.Errorf("ferrynats: Config.Stream (--stream / FERRY_STREAM for `ferry`) %q is not a valid stream name: it may not contain whitespace, '.', '*', '>', '/' or '\\'", c.Stream)
	}
	if c.MaxInFlight < 0 {
		return fmt.Errorf("ferrynats: Config.MaxInFlight is %d; set it > 0, or 0 for %d", c.MaxInFlight, DefaultMaxInFlight)
	}
	if c.AckTimeout < 0 {
		return fmt.Errorf("ferrynats: Config.AckTimeout is %s; set it > 0, or 0 for %s", c.AckTimeout, DefaultAckTimeout)
	}
	if c.Shares < 0 || c.Shares > MaxShares {
		return fmt.Errorf("ferrynats: Config.Shares is %d; set it between 2 and %d to divide the subjects into shares, or 0 for none", c.Shares, MaxShares)
	}
	if c.Shares > 1 && c.Subject != nil {
		return errors.New("ferrynats: Config.Shares and Config.Subject are both set; a shared sink maps subjects itself (\"<SubjectPrefix>.<share>.<Topic>\"): unset one of them")
	}
	if sc := c.StreamConfig; sc != nil && sc.Name != "" && sc.Name != c.Stream {
		return fmt.Errorf("ferrynats: Config.StreamConfig.Name %q differs from Config.Stream %q; leave StreamConfig.Name empty or make them equal", sc.Name, c.Stream)
	}
	return nil
}

// MaxShares is the most shares a sink or source divides the subjects into.
const MaxShares = 1024

// shareSubject is the subject of topic's events in share i.
func shareSubject(prefix string, i int, topic string) string {
	return prefix + "." + strconv.Itoa(i) + "." + topic
}

// prefixSubjects is the subject filter covering every subject of the
// prefix mapping.
func (c *Config) prefixSubjects() string {
	return c.SubjectPrefix + ".>"
}

// streamConfig is the configuration of a stream created by New.
func (c *Config) streamConfig() jetstream.StreamConfig {
	if c.StreamConfig != nil {
		sc := *c.StreamConfig
		sc.Name = c.Stream
		if len(sc.Subjects) == 0 {
			sc.Subjects = []string{c.prefixSubjects()}
		}
		return sc
	}
	return jetstream.StreamConfig{
		Name:        c.Stream,
		Description: "Ferry outbox events",
		Subjects:    []string{c.prefixSubjects()},
		Storage:     jetstream.FileStorage,
		Duplicates:  DefaultDuplicateWindow,
	}
}

// invalidSubject says what is wrong with a literal subject (no wildcards),
// or returns "" when it is valid.
func invalidSubject(s string) string {
	switch {
	case s == "":
		return "it is empty"
	case strings.ContainsAny(s, " \t\r\n\f\v\x00"):
		return "it contains whitespace or NUL"
	}
	for tok := range strings.SplitSeq(s, ".") {
		switch tok {
		case "":
			return "it has an empty token (a leading, trailing or doubled '.')"
		case "*", ">":
			return "it has a wildcard token (" + tok + ")"
		}
	}
	return ""
}

// covers reports whether the subject filter pattern matches every subject
// that filter matches. Both may hold wildcards: "*" matches one token, ">"
// one or more trailing tokens.
func covers(pattern, filter string) bool {
	pt := strings.Split(pattern, ".")
	ft := strings.Split(filter, ".")
	for i, p := range pt {
		if p == ">" {
			return len(ft) > i
		}
		if i >= len(ft) {
			return false
		}
		switch f := ft[i]; {
		case p == "*":
			if f == ">" {
				return false
			}
		case p != f:
			return false
		}
	}
	return len(pt) == len(ft)
}
