package ferrynats

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
)

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

// System returns "nats", the broker the source reads, for telemetry
// (ferrysink.Describer): ferry.Consumer.Consume reports its deliveries
// with it.
func (s *Source) System() string { return "nats" }
