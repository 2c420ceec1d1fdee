package ferrynats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
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

// Source reads the events a Sink published, through a durable JetStream
// pull consumer, and hands them to a consumer's inbox. Create it with
// NewSource and call Run.
type Source struct {
	js    jetstream.JetStream
	cfg   *SourceConfig // WithDefaults applied
	lines []*line       // one, or one per share
}

// line is a durable the source reads: the whole source, or a share.
type line struct {
	cons    jetstream.Consumer
	durable string
	running atomic.Bool
}

// ReaderName implements ferrysink.SingleReader: the durable is one
// ordering line, and ferry.Consumer.Consume lets one process read it at a
// time (a shared source: one process per share).
func (s *Source) ReaderName() string { return "nats/" + s.cfg.Stream + "/" + s.cfg.Durable }

// Shares implements ferrysink.Shared: SourceConfig.Shares, or 1.
func (s *Source) Shares() int { return len(s.lines) }

// NewSource creates the durable pull consumer SourceConfig.Durable on
// SourceConfig.Stream (cfg must name Durable), or updates it when it
// exists, with explicit acks, delivery from the start of the stream, no
// delivery limit, the subject filter, AckWait and MaxAckPending. The stream
// must exist and capture the filter. js comes from jetstream.New on a
// connection the caller owns.
func NewSource(ctx context.Context, js jetstream.JetStream, cfg *SourceConfig) (*Source, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if js == nil {
		return nil, errors.New("ferrynats: NewSource needs JetStream: pass jetstream.New(nc) for a connection from nats.Connect")
	}
	stream, err := js.Stream(ctx, c.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("ferrynats: stream %q not found: set SourceConfig.Stream to the stream the sink publishes to, or create stream %s (the sink does with Config.CreateStream): %w",
			c.Stream, c.Stream, err)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return nil, fmt.Errorf("ferrynats: look up stream %q: %w; enable JetStream on the server (nats-server -js) and for the account", c.Stream, err)
	case err != nil:
		return nil, fmt.Errorf("ferrynats: look up stream %q: %w", c.Stream, err)
	}
	info := stream.CachedInfo()
	if info.Config.Mirror == nil && len(info.Config.Sources) == 0 && !slices.ContainsFunc(info.Config.Subjects, func(s string) bool { return covers(s, c.filter()) }) {
		return nil, fmt.Errorf("ferrynats: stream %q does not capture the subjects %q (its subjects: %s): set SourceConfig.SubjectPrefix to the sink's Config.SubjectPrefix, or SourceConfig.FilterSubject to subjects the stream captures",
			c.Stream, c.filter(), quoteList(info.Config.Subjects))
	}
	if c.Shares > 1 {
		if err := checkShares(ctx, stream, c); err != nil {
			return nil, err
		}
	}
	src := &Source{js: js, cfg: c}
	durables, filters := c.lines()
	for i, durable := range durables {
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:       durable,
			Description:   "Ferry source",
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       c.AckWait,
			// A message past MaxDeliver would be dropped, and its event lost.
			MaxDeliver:    -1,
			FilterSubject: filters[i],
			MaxAckPending: c.MaxAckPending,
		})
		if err != nil {
			return nil, fmt.Errorf("ferrynats: create or update durable consumer %q on stream %q: %w; if it exists with settings that cannot change (a push consumer, another deliver policy), delete it or choose another SourceConfig.Durable",
				durable, c.Stream, err)
		}
		src.lines = append(src.lines, &line{cons: cons, durable: durable})
	}
	return src, nil
}

// checkShares refuses a shared source whose stream holds messages on
// share subjects it would never read ("<prefix>.<share>.…" with a share
// past its own count: the sink has more shares), and warns about messages
// outside every share's subjects (a sink without shares, or messages from
// before they were set), which no durable of the source reads.
func checkShares(ctx context.Context, stream jetstream.Stream, c *SourceConfig) error {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(c.SubjectPrefix+".>"))
	if err != nil {
		return fmt.Errorf("ferrynats: read the subjects of stream %q: %w", c.Stream, err)
	}
	var beyond, outside []string
	for subject, n := range info.State.Subjects {
		if n == 0 {
			continue
		}
		token, _, _ := strings.Cut(strings.TrimPrefix(subject, c.SubjectPrefix+"."), ".")
		share, err := strconv.Atoi(token)
		switch {
		case err != nil || share < 0 || !strings.Contains(strings.TrimPrefix(subject, c.SubjectPrefix+"."), "."):
			outside = append(outside, subject)
		case share >= c.Shares:
			beyond = append(beyond, subject)
		}
	}
	slices.Sort(beyond)
	slices.Sort(outside)
	if len(beyond) > 0 {
		return fmt.Errorf("ferrynats: stream %q holds messages on subjects of shares past SourceConfig.Shares (%d), which this source would never read: %s; "+
			"set SourceConfig.Shares to the sink's Config.Shares (the relay's --shares)", c.Stream, c.Shares, quoteList(beyond[:min(len(beyond), 5)]))
	}
	if len(outside) > 0 {
		c.Logger.Warn("ferrynats: the stream holds messages outside every share's subjects, which this shared source does not read: a sink without Config.Shares (the relay's --shares) publishes there, or they are from before the shares were set",
			"stream", c.Stream, "subjects", outside[:min(len(outside), 5)], "shares", c.Shares)
	}
	return nil
}

// Run fetches events and hands them to ingest until ctx ends, then returns
// nil. ingest must record the events durably, deduplicated by ID, and
// return nil only then; Consumer.Ingest does:
//
//	err := src.Run(ctx, func(ctx context.Context, evs []*ferryevent.Event) error {
//		_, err := consumer.Ingest(ctx, evs)
//		return err
//	})
//
// Events reach ingest in stream order, at most SourceConfig.Batch at a
// time, and a batch is acknowledged to JetStream only after ingest returned
// nil for it. When ingest fails, Run acknowledges nothing, backs off and
// hands it the same batch again, fetching nothing else meanwhile, until it
// succeeds or ctx ends; it keeps extending the batch's ack deadline so that
// JetStream does not deliver it again behind its back. ingest may still see
// an event twice (after a restart, or an acknowledgement lost on the way),
// which an inbox that deduplicates by ID absorbs.
//
// A message that does not decode goes to SourceConfig.OnInvalid and is
// terminated; the rest of its batch is ingested.
//
// When ctx ends, Run stops at once, including while ingest is retried,
// and hands the messages it held back to JetStream for immediate
// redelivery. When it starts, or sees that deliveries of its durable went
// elsewhere, it ingests nothing until every message pending on the durable
// has been delivered to it, so that a message left unacknowledged by a
// crashed process cannot fall behind a later one. JetStream delivers such
// a message again after AckWait; Run waits at most twice AckWait, then
// logs a warning and goes on.
//
// Run returns an error when ingest is nil, when Run is already running, or
// when the durable consumer has been deleted. It retries everything else.
//
// A shared source (SourceConfig.Shares) runs every share's durable at
// once; ferry.Consumer.Consume instead runs the shares this process is
// given (RunShare).
func (s *Source) Run(ctx context.Context, ingest func(ctx context.Context, events []*ferryevent.Event) error) error {
	if len(s.lines) == 1 {
		return s.RunShare(ctx, 0, ingest)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(s.lines))
	for i := range s.lines {
		go func() { errs <- s.RunShare(ctx, i, ingest) }()
	}
	var first error
	for range s.lines {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

// RunShare implements ferrysink.Shared: it reads share i's durable as Run
// reads an unshared source's (share 0 of an unshared source is all of it).
func (s *Source) RunShare(ctx context.Context, i int, ingest func(ctx context.Context, events []*ferryevent.Event) error) error {
	if ingest == nil {
		return errors.New("ferrynats: Source.Run needs an ingest function, one that records events in the consumer's inbox (Consumer.Ingest)")
	}
	if i < 0 || i >= len(s.lines) {
		return fmt.Errorf("ferrynats: share %d does not exist: the source has %d (SourceConfig.Shares)", i, len(s.lines))
	}
	l := s.lines[i]
	if !l.running.CompareAndSwap(false, true) {
		return fmt.Errorf("ferrynats: Source.Run is already running for durable %q; run one Source per durable at a time", l.durable)
	}
	defer l.running.Store(false)
	r := &run{
		s:      s,
		l:      l,
		log:    s.cfg.Logger.With("stream", s.cfg.Stream, "durable", l.durable),
		ingest: ingest,
		retry:  backoff.Policy{Base: s.cfg.RetryBase, Max: s.cfg.RetryMax},
	}
	return r.loop(ctx)
}

// delivery is a message delivered to the run and not yet settled.
type delivery struct {
	msg jetstream.Msg
	seq uint64 // stream sequence
	ev  *ferryevent.Event
	// older holds earlier deliveries of the same stream message, which
	// JetStream sent again after their ack wait: they are acknowledged and
	// released with msg.
	older []jetstream.Msg
}

// run is the state of one Source.Run call. Only Run's goroutine changes
// it; mu guards held against the keepalive goroutine, which reads it.
type run struct {
	s      *Source
	l      *line
	log    *slog.Logger
	ingest func(context.Context, []*ferryevent.Event) error
	retry  backoff.Policy

	mu sync.Mutex
	// held is every message delivered to this run and not yet acknowledged,
	// terminated or released, in stream order, one entry per stream
	// message.
	held []*delivery

	// lastDelivery is the consumer (delivery) sequence of the last message
	// received. JetStream numbers every delivery of the durable, so a jump
	// means some went to someone else, or were lost on the way.
	lastDelivery uint64
	// recovering is set while messages pending on the durable may be
	// outside held: ingesting then could put a later message of a key ahead
	// of one JetStream will deliver again. It ends when the durable's
	// pending count equals len(held), or at recoverBy.
	recovering bool
	recoverBy  time.Time
}

func (r *run) loop(ctx context.Context) error {
	info, err := r.consumerInfo(ctx)
	if err != nil || info == nil {
		return err // nil when ctx ended
	}
	r.lastDelivery = info.Delivered.Consumer
	if info.NumAckPending > 0 {
		r.recover(fmt.Sprintf("%d messages delivered earlier are unacknowledged", info.NumAckPending))
	}

	stop := r.keepAlive()
	defer func() {
		stop()
		r.release()
	}()
	for ctx.Err() == nil {
		if r.recovering {
			r.checkRecovered(ctx)
		}
		if !r.recovering && len(r.held) > 0 {
			r.ingestNext(ctx)
			continue
		}
		if err := r.fetch(ctx); err != nil {
			return err
		}
	}
	return nil
}

// consumerInfo reads the durable's state, retrying until it succeeds, ctx
// ends (nil, nil) or the durable is gone.
func (r *run) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	for attempt := 1; ; attempt++ {
		info, err := r.l.cons.Info(ctx)
		switch {
		case err == nil:
			return info, nil
		case ctx.Err() != nil:
			return nil, nil
		case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrConsumerDeleted):
			return nil, r.gone(err)
		}
		r.log.Warn("ferrynats: read the durable consumer's state; retrying", "attempt", attempt, "err", err)
		if !r.retry.Sleep(ctx.Done(), attempt) {
			return nil, nil
		}
	}
}

func (r *run) gone(err error) error {
	return fmt.Errorf("ferrynats: durable consumer %q of stream %q is gone: %w; create it again with NewSource and call Run", r.l.durable, r.s.cfg.Stream, err)
}

// recover starts waiting for the durable's pending messages to be in held.
func (r *run) recover(reason string) {
	if r.recovering {
		return
	}
	r.recovering = true
	r.recoverBy = time.Now().Add(2 * r.s.cfg.AckWait)
	r.log.Info("ferrynats: waiting for the durable's unacknowledged messages to be delivered again before ingesting, to keep their order", "reason", reason)
}

// checkRecovered ends recovery once every message pending on the durable is
// held, or at the deadline. The server may count an ack or a termination
// it has not processed yet as pending: that only prolongs recovery.
func (r *run) checkRecovered(ctx context.Context) {
	info, err := r.l.cons.Info(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("ferrynats: read the durable consumer's state", "err", err)
		}
		return
	}
	outside := info.NumAckPending - len(r.held)
	switch {
	case outside <= 0:
		r.recovering = false
		r.log.Debug("ferrynats: every unacknowledged message is back; ingesting", "held", len(r.held))
	case time.Now().After(r.recoverBy):
		r.recovering = false
		r.log.Warn("ferrynats: messages of the durable are still unacknowledged and not delivered here after twice its ack wait; ingesting anyway, their events may arrive out of order. Is another Source running on this durable?",
			"unacknowledged", outside, "ack_wait", r.s.cfg.AckWait)
	}
}

// fetch receives the next messages into held. It returns at once the
// messages already available, or else waits up to MaxWait for one, then
// takes whatever else is available. While recovering it waits MaxWait for
// a full batch instead: a request that does not wait can stall when
// MaxAckPending is reached, until nats.go gives up on it, and a message the
// server sends it after that is lost to this run. fetch returns an error
// only when the durable is gone.
func (r *run) fetch(ctx context.Context) error {
	batch := r.s.cfg.Batch
	var (
		msgs []jetstream.Msg
		err  error
	)
	if r.recovering {
		msgs, err = r.pull(ctx, batch, true)
	} else {
		msgs, err = r.pull(ctx, batch, false)
		if err == nil && len(msgs) == 0 {
			msgs, err = r.pull(ctx, 1, true)
			if err == nil && len(msgs) > 0 && batch > 1 {
				var more []jetstream.Msg
				more, err = r.pull(ctx, batch-1, false)
				msgs = append(msgs, more...)
			}
		}
	}
	for _, m := range msgs {
		r.accept(ctx, m)
	}
	switch {
	case err == nil, ctx.Err() != nil:
		return nil
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
		return r.gone(err)
	}
	if _, infoErr := r.l.cons.Info(ctx); errors.Is(infoErr, jetstream.ErrConsumerNotFound) {
		return r.gone(infoErr)
	}
	r.log.Warn("ferrynats: fetch from the durable consumer failed; retrying", "err", err)
	if len(msgs) > 0 {
		return nil // ingest what arrived first
	}
	t := time.NewTimer(r.s.cfg.MaxWait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}

// pull sends one pull request for up to n messages and collects them. With
// wait, the request waits up to MaxWait for them and is abandoned when ctx
// ends; without, it takes what is available now.
func (r *run) pull(ctx context.Context, n int, wait bool) ([]jetstream.Msg, error) {
	var (
		batch jetstream.MessageBatch
		err   error
	)
	if wait {
		// FetchContext asks the server to expire the request a tenth
		// (at most a second) before the context's deadline: set the
		// deadline so that the server waits MaxWait.
		d := r.s.cfg.MaxWait
		if d >= 9*time.Second {
			d += time.Second
		} else {
			d = d * 10 / 9
		}
		fctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		batch, err = r.l.cons.Fetch(n, jetstream.FetchContext(fctx))
	} else {
		batch, err = r.l.cons.FetchNoWait(n)
	}
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	err = batch.Error()
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		// The server's expiry did not arrive before our deadline. A
		// message it sent meanwhile is lost; the next delivery's sequence
		// shows it, and accept starts a recovery.
		err = nil
	}
	return msgs, err
}

// accept decodes a delivered message into held, or hands it to OnInvalid
// and terminates it.
func (r *run) accept(ctx context.Context, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		r.invalid(ctx, m, fmt.Errorf("%w: no JetStream metadata: %v", ErrMalformed, err))
		return
	}
	if dseq := md.Sequence.Consumer; dseq > r.lastDelivery+1 {
		r.recover(fmt.Sprintf("deliveries %d to %d of the durable were not received here", r.lastDelivery+1, dseq-1))
	}
	r.lastDelivery = max(r.lastDelivery, md.Sequence.Consumer)

	ev, err := DecodeJetStream(m)
	if err != nil {
		r.invalid(ctx, m, err)
		return
	}
	seq := md.Sequence.Stream
	r.mu.Lock()
	defer r.mu.Unlock()
	i, found := slices.BinarySearchFunc(r.held, seq, func(d *delivery, seq uint64) int {
		switch {
		case d.seq < seq:
			return -1
		case d.seq > seq:
			return 1
		}
		return 0
	})
	if found {
		// Delivered again, after its ack wait passed: keep the latest
		// delivery, settle both.
		d := r.held[i]
		d.older = append(d.older, d.msg)
		d.msg, d.ev = m, &ev
		return
	}
	r.held = slices.Insert(r.held, i, &delivery{msg: m, seq: seq, ev: &ev})
}

// invalid reports a message that is not a Ferry event and terminates it.
func (r *run) invalid(ctx context.Context, m jetstream.Msg, err error) {
	func() {
		defer func() {
			if p := recover(); p != nil {
				r.log.Error("ferrynats: SourceConfig.OnInvalid panicked", "panic", p, "subject", m.Subject())
			}
		}()
		if r.s.cfg.OnInvalid != nil {
			r.s.cfg.OnInvalid(ctx, m, err)
			return
		}
		attrs := []any{"subject", m.Subject(), "err", err}
		if md, mdErr := m.Metadata(); mdErr == nil {
			attrs = append(attrs, "stream_seq", md.Sequence.Stream)
		}
		r.log.Error("ferrynats: message is not a Ferry event; terminating it", attrs...)
	}()
	if err := m.Term(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		r.log.Warn("ferrynats: terminate a message that is not a Ferry event; JetStream will deliver it again", "subject", m.Subject(), "err", err)
	}
}

// ingestNext hands the first Batch held messages to ingest until it
// succeeds, then acknowledges them. It returns early when ctx ends, leaving
// them held.
func (r *run) ingestNext(ctx context.Context) {
	chunk := r.held[:min(len(r.held), r.s.cfg.Batch)]
	events := make([]*ferryevent.Event, 0, len(chunk))
	seen := make(map[uuid.UUID]bool, len(chunk))
	for _, d := range chunk {
		// Two stream messages may carry one event (published again after
		// the duplicate window); the inbox would keep the first.
		if !seen[d.ev.ID] {
			seen[d.ev.ID] = true
			events = append(events, d.ev)
		}
	}
	for attempt := 1; ; attempt++ {
		err := r.ingest(ctx, events)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("ferrynats: ingest failed; retrying the same batch",
			"attempt", attempt, "events", len(events), "first_stream_seq", chunk[0].seq, "last_stream_seq", chunk[len(chunk)-1].seq, "err", err)
		if !r.retry.Sleep(ctx.Done(), attempt) {
			return
		}
	}
	r.ack(ctx, chunk)
	r.mu.Lock()
	r.held = slices.Delete(r.held, 0, len(chunk))
	r.mu.Unlock()
}

// ack acknowledges an ingested chunk. It waits for the server's reply to
// the last ack only: JetStream processes a consumer's acks in order. A
// failure is logged and otherwise ignored: the events are in the inbox,
// and a message delivered again is a duplicate the inbox drops.
func (r *run) ack(ctx context.Context, chunk []*delivery) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	var failed int
	var last error
	for i, d := range chunk {
		for _, m := range d.older {
			_ = m.Ack() // the server ignores an ack for a message it no longer tracks
		}
		var err error
		if i == len(chunk)-1 {
			err = d.msg.DoubleAck(actx)
		} else {
			err = d.msg.Ack()
		}
		if err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			failed, last = failed+1, err
		}
	}
	if failed > 0 {
		r.log.Warn("ferrynats: acknowledge ingested messages; JetStream will deliver them again and the inbox will drop the copies",
			"failed", failed, "messages", len(chunk), "err", last)
	}
}

// keepAlive extends the ack deadline of every held message each third of
// AckWait until the returned function is called.
func (r *run) keepAlive() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.s.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				r.touch()
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

func (r *run) touch() {
	r.mu.Lock()
	msgs := make([]jetstream.Msg, 0, len(r.held))
	for _, d := range r.held {
		msgs = append(msgs, d.msg)
		msgs = append(msgs, d.older...)
	}
	r.mu.Unlock()
	var failed int
	var last error
	for _, m := range msgs {
		// An ack may overtake this; the server ignores progress for a
		// message it no longer tracks.
		if err := m.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			failed, last = failed+1, err
		}
	}
	if failed > 0 {
		r.log.Warn("ferrynats: extend the ack deadline of held messages; JetStream may deliver them again, which the inbox absorbs",
			"failed", failed, "messages", len(msgs), "err", last)
	}
}

// release hands the held messages back to JetStream for immediate
// redelivery, in stream order, so that the next run receives them before
// anything newer, and flushes the connection.
func (r *run) release() {
	r.mu.Lock()
	held := r.held
	r.held = nil
	r.mu.Unlock()
	if len(held) == 0 {
		return
	}
	for _, d := range held {
		_ = d.msg.Nak() // if lost, the message comes back after AckWait
		for _, m := range d.older {
			_ = m.Nak()
		}
	}
	if err := r.s.js.Conn().FlushTimeout(time.Second); err != nil {
		r.log.Debug("ferrynats: flush released messages", "err", err)
	}
}

// System returns "nats", the broker the source reads, for telemetry
// (ferrysink.Describer): ferry.Consumer.Consume reports its deliveries
// with it.
func (s *Source) System() string { return "nats" }
