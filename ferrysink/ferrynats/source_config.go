package ferrynats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Defaults applied by SourceConfig.WithDefaults.
const (
	DefaultBatch     = 256
	DefaultMaxWait   = time.Second
	DefaultAckWait   = 10 * time.Second
	DefaultRetryBase = 100 * time.Millisecond
	DefaultRetryMax  = 30 * time.Second
)

// MinAckWait is the shortest SourceConfig.AckWait accepted. The source
// extends the deadline of the messages it holds every third of AckWait;
// below a second that races the server's redelivery timer.
const MinAckWait = time.Second

// ackTimeout bounds the wait for the server's confirmation of a batch's
// acknowledgements. The acks are sent even when Run's context has ended: the
// events are already in the inbox.
const ackTimeout = 5 * time.Second

// SourceConfig configures a Source. Durable is required.
type SourceConfig struct {
	// Stream names the JetStream stream to read, the one the sink publishes
	// to. Default: DefaultStream.
	Stream string

	// Durable names the durable pull consumer the source reads through,
	// typically the consumer group: JetStream keeps its position. NewSource
	// creates it, or updates an existing one to this configuration.
	// Required; no whitespace, '.', '*', '>', '/' or '\'.
	//
	// Run one Source per durable at a time: the durable is one ordering
	// line, and two readers would each see part of it. ferry.Consumer.
	// Consume enforces it across processes with a lease (see ReaderName).
	// To spread the load over replicas, set Shares.
	Durable string

	// Shares, when above 1, reads the subjects of a sink with the same
	// Config.Shares through a durable per share, "<Durable>-<share>"
	// filtering "<SubjectPrefix>.<share>.>": ferry.Consumer.Consume
	// balances the shares over the processes that run it (ferrysink.Shared),
	// and Run reads them all. Not with FilterSubject. Changing it moves keys
	// between shares: drain the durables first (a share's durable reads
	// from the start of the stream when created; the inbox drops what it
	// already has).
	Shares int

	// SubjectPrefix selects the subjects "<SubjectPrefix>.>", as the sink
	// maps them. Default: DefaultSubjectPrefix. Leave it empty when
	// FilterSubject is set.
	SubjectPrefix string

	// FilterSubject, when set, is the durable's subject filter (wildcards
	// allowed), in place of "<SubjectPrefix>.>". The stream must capture
	// it.
	FilterSubject string

	// Batch is the most messages fetched, and handed to ingest, at a time.
	// Default: DefaultBatch.
	Batch int

	// MaxWait is how long one fetch waits for a message when none is
	// available. Run notices a cancelled context at once whatever its
	// value. Default: DefaultMaxWait.
	MaxWait time.Duration

	// AckWait is the durable's ack wait: a message delivered and neither
	// acknowledged nor extended within it is delivered again. Run extends
	// the messages it holds every AckWait/3 while ingest runs or is
	// retried, so AckWait mostly bounds how long the messages of a crashed
	// process wait before they come back: a standby that takes the durable
	// over (ferry.Consumer.Consume) ingests nothing newer until then. At
	// least MinAckWait. Default: DefaultAckWait (10 s; a standby takes
	// over within ConsumerConfig.SourceLeaseTTL, 5 s by default).
	AckWait time.Duration

	// MaxAckPending bounds the messages delivered and not yet acknowledged.
	// At least Batch. Default: 4 * Batch.
	MaxAckPending int

	// RetryBase and RetryMax bound the exponential backoff, with jitter,
	// between attempts to ingest a batch that failed. Defaults:
	// DefaultRetryBase, and DefaultRetryMax or RetryBase if larger.
	RetryBase, RetryMax time.Duration

	// OnInvalid is called, from Run's goroutine, with a message that does
	// not decode as a Ferry event (err wraps ErrMalformed). The message is
	// then terminated: JetStream never delivers it again. Keep it short;
	// the line waits for it. Default: log the message's subject, stream
	// sequence and the error at level Error.
	OnInvalid func(ctx context.Context, msg jetstream.Msg, err error)

	// Logger receives the source's warnings (failed ingests, fetches and
	// acknowledgements) and debug messages. Default: slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c (which may be nil) with every unset field
// set to its default.
func (c *SourceConfig) WithDefaults() *SourceConfig {
	var out SourceConfig
	if c != nil {
		out = *c
	}
	if out.Stream == "" {
		out.Stream = DefaultStream
	}
	if out.FilterSubject == "" && out.SubjectPrefix == "" {
		out.SubjectPrefix = DefaultSubjectPrefix
	}
	if out.Batch == 0 {
		out.Batch = DefaultBatch
	}
	if out.MaxWait == 0 {
		out.MaxWait = DefaultMaxWait
	}
	if out.AckWait == 0 {
		out.AckWait = DefaultAckWait
	}
	if out.MaxAckPending == 0 && out.Batch > 0 {
		out.MaxAckPending = 4 * out.Batch
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
	switch {
	case c.Durable == "":
		return errors.New("ferrynats: SourceConfig.Durable is empty; name the durable consumer, typically after the consumer group")
	case strings.ContainsAny(c.Durable, " \t\r\n.*>/\\"):
		return fmt.Errorf("ferrynats: SourceConfig.Durable %q is not a valid consumer name: it may not contain whitespace, '.', '*', '>', '/' or '\\'", c.Durable)
	case strings.ContainsAny(c.Stream, " \t\r\n.*>/\\"):
		return fmt.Errorf("ferrynats: SourceConfig.Stream %q is not a valid stream name: it may not contain whitespace, '.', '*', '>', '/' or '\\'", c.Stream)
	case c.Shares < 0 || c.Shares > MaxShares:
		return fmt.Errorf("ferrynats: SourceConfig.Shares is %d; set it between 2 and %d (the sink's Config.Shares), or 0 for one durable", c.Shares, MaxShares)
	case c.Shares > 1 && c.FilterSubject != "":
		return fmt.Errorf("ferrynats: SourceConfig.Shares and SourceConfig.FilterSubject %q are both set; a shared source filters \"<SubjectPrefix>.<share>.>\" per share: unset one of them", c.FilterSubject)
	case c.FilterSubject != "" && c.SubjectPrefix != "":
		return fmt.Errorf("ferrynats: SourceConfig.FilterSubject %q and SourceConfig.SubjectPrefix %q are both set; set one of them", c.FilterSubject, c.SubjectPrefix)
	case c.Batch < 0:
		return fmt.Errorf("ferrynats: SourceConfig.Batch is %d; set it > 0, or 0 for %d", c.Batch, DefaultBatch)
	case c.MaxWait < 0:
		return fmt.Errorf("ferrynats: SourceConfig.MaxWait is %s; set it > 0, or 0 for %s", c.MaxWait, DefaultMaxWait)
	case c.AckWait < MinAckWait:
		return fmt.Errorf("ferrynats: SourceConfig.AckWait is %s; set it to at least %s, or 0 for %s", c.AckWait, MinAckWait, DefaultAckWait)
	case c.MaxAckPending < c.Batch:
		return fmt.Errorf("ferrynats: SourceConfig.MaxAckPending is %d, less than SourceConfig.Batch (%d); set it to at least Batch, or 0 for 4 * Batch", c.MaxAckPending, c.Batch)
	case c.RetryBase < 0:
		return fmt.Errorf("ferrynats: SourceConfig.RetryBase is %s; set it > 0, or 0 for %s", c.RetryBase, DefaultRetryBase)
	case c.RetryMax < c.RetryBase:
		return fmt.Errorf("ferrynats: SourceConfig.RetryMax (%s) is less than SourceConfig.RetryBase (%s); raise RetryMax", c.RetryMax, c.RetryBase)
	}
	if c.SubjectPrefix != "" {
		if reason := invalidSubject(c.SubjectPrefix); reason != "" {
			return fmt.Errorf("ferrynats: SourceConfig.SubjectPrefix %q is not a valid subject prefix: %s", c.SubjectPrefix, reason)
		}
	} else if reason := invalidFilter(c.FilterSubject); reason != "" {
		return fmt.Errorf("ferrynats: SourceConfig.FilterSubject %q is not a valid subject filter: %s", c.FilterSubject, reason)
	}
	return nil
}

// filter is the subject filter of the whole source.
func (c *SourceConfig) filter() string {
	if c.FilterSubject != "" {
		return c.FilterSubject
	}
	return c.SubjectPrefix + ".>"
}

// lines are the durables the source reads, and their filters: one, or
// one per share.
func (c *SourceConfig) lines() (durables, filters []string) {
	if c.Shares <= 1 {
		return []string{c.Durable}, []string{c.filter()}
	}
	for i := range c.Shares {
		durables = append(durables, c.Durable+"-"+strconv.Itoa(i))
		filters = append(filters, c.SubjectPrefix+"."+strconv.Itoa(i)+".>")
	}
	return durables, filters
}

// invalidFilter says what is wrong with a subject filter, or returns ""
// when it is valid: tokens may be "*", and the last may be ">".
func invalidFilter(s string) string {
	switch {
	case s == "":
		return "it is empty"
	case strings.ContainsAny(s, " \t\r\n\f\v\x00"):
		return "it contains whitespace or NUL"
	}
	tokens := strings.Split(s, ".")
	for i, tok := range tokens {
		switch {
		case tok == "":
			return "it has an empty token (a leading, trailing or doubled '.')"
		case tok == ">" && i != len(tokens)-1:
			return "'>' is not its last token"
		case tok != "*" && tok != ">" && strings.ContainsAny(tok, "*>"):
			return "a wildcard is part of a token (" + tok + ")"
		}
	}
	return ""
}
