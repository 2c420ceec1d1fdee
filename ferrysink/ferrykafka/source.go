package ferrykafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
)

// Defaults applied by SourceConfig.WithDefaults.
const (
	DefaultBatch     = 256
	DefaultRetryBase = 100 * time.Millisecond
	DefaultRetryMax  = 30 * time.Second
)

// SourceConfig configures a Source. Brokers, Group and Topics are required.
type SourceConfig struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string
	// Group is the Kafka consumer group: Kafka keeps its committed offsets,
	// and spreads the topics' partitions over the group's members.
	Group string
	// Topics are the Kafka topics to read.
	Topics []string
	// Batch is the most records handed to ingest at a time, all of one
	// partition. Default DefaultBatch.
	Batch int
	// RetryBase and RetryMax bound the backoff between attempts to ingest
	// a batch that failed. Defaults DefaultRetryBase and DefaultRetryMax.
	RetryBase, RetryMax time.Duration
	// Invalid is called for each record that is not a Ferry event; the
	// source then goes past it (Kafka has no per-record rejection). Default:
	// log it as an error.
	Invalid func(r *kgo.Record, err error)
	// ClientOptions are passed to kgo.NewClient after Ferry's own (SASL,
	// TLS, ...).
	ClientOptions []kgo.Opt
	// Logger receives warnings. Default: discard.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with defaults filled in.
func (c *SourceConfig) WithDefaults() *SourceConfig {
	out := SourceConfig{}
	if c != nil {
		out = *c
	}
	if out.Batch == 0 {
		out.Batch = DefaultBatch
	}
	if out.RetryBase == 0 {
		out.RetryBase = DefaultRetryBase
	}
	if out.RetryMax == 0 {
		out.RetryMax = DefaultRetryMax
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.Invalid == nil {
		log := out.Logger
		out.Invalid = func(r *kgo.Record, err error) {
			log.Error("ferrykafka: skipping a record that is not a Ferry event", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
		}
	}
	return &out
}

// Source reads Ferry events from Kafka topics as one consumer group member
// and hands them to a consumer's inbox. Offsets are committed only after
// ingest accepted the records; a batch that fails is retried, in the same
// order, before anything later of its partition, so each key's order holds.
// Rebalances wait for the batch in hand (kgo.BlockRebalanceOnPoll).
type Source struct {
	cfg    *SourceConfig
	client *kgo.Client
	once   sync.Once
}

// NewSource joins the consumer group. Run starts reading.
func NewSource(ctx context.Context, cfg *SourceConfig) (*Source, error) {
	c := cfg.WithDefaults()
	if err := checkBrokers("SourceConfig", c.Brokers); err != nil {
		return nil, err
	}
	switch {
	case strings.TrimSpace(c.Group) == "":
		return nil, errors.New("ferrykafka: SourceConfig.Group is empty: name the consumer group (Kafka keeps its offsets)")
	case len(c.Topics) == 0:
		return nil, errors.New("ferrykafka: SourceConfig.Topics is empty: name the topics the sink writes")
	case c.Batch < 1:
		return nil, fmt.Errorf("ferrykafka: SourceConfig.Batch %d: use at least 1", c.Batch)
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ConsumerGroup(c.Group),
		kgo.ConsumeTopics(c.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, c.ClientOptions...)
	client, err := connect(ctx, c.Brokers, opts)
	if err != nil {
		return nil, err
	}
	return &Source{cfg: c, client: client}, nil
}

// errRunTwice is returned by a second Run.
var errRunTwice = errors.New("ferrykafka: Source.Run was called twice; create a Source per run")

// Run reads until ctx ends, then commits what ingest accepted, leaves the
// group and closes the client. A source runs once.
func (s *Source) Run(ctx context.Context, ingest func(ctx context.Context, events []*ferryevent.Event) error) error {
	first := false
	s.once.Do(func() { first = true })
	if !first {
		return errRunTwice
	}
	defer s.client.Close() // leaves the group
	for ctx.Err() == nil {
		fetches := s.client.PollRecords(ctx, s.cfg.Batch)
		if ctx.Err() != nil {
			s.client.AllowRebalance()
			break
		}
		for _, fe := range fetches.Errors() {
			if !errors.Is(fe.Err, context.Canceled) {
				s.cfg.Logger.Warn("ferrykafka: fetch failed; the client retries", "topic", fe.Topic, "partition", fe.Partition, "err", fe.Err)
			}
		}
		var err error
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if err == nil && ctx.Err() == nil && len(p.Records) > 0 {
				err = s.handle(ctx, p.Records, ingest)
			}
		})
		s.client.AllowRebalance()
		if err != nil {
			return err
		}
	}
	return nil
}

// handle ingests one partition's records in batches, retrying a failed
// batch until it is accepted or ctx ends, and commits each accepted batch.
func (s *Source) handle(ctx context.Context, records []*kgo.Record, ingest func(context.Context, []*ferryevent.Event) error) error {
	events := make([]*ferryevent.Event, 0, len(records))
	for _, r := range records {
		ev, err := Decode(r)
		if err != nil {
			s.cfg.Invalid(r, err)
			continue
		}
		events = append(events, &ev)
	}
	retry := backoff.Policy{Base: s.cfg.RetryBase, Max: s.cfg.RetryMax}
	for attempt := 1; len(events) > 0; attempt++ {
		err := ingest(ctx, events)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil // not committed: delivered again to the next reader
		}
		s.cfg.Logger.Warn("ferrykafka: ingest failed; retrying the same records", "topic", records[0].Topic, "partition", records[0].Partition,
			"offset", records[0].Offset, "records", len(events), "attempt", attempt, "err", err)
		if !retry.Sleep(ctx.Done(), attempt) {
			return nil
		}
	}
	// Commit even if ctx just ended: the events are in the inbox.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.client.CommitRecords(cctx, records...); err != nil {
		s.cfg.Logger.Warn("ferrykafka: commit failed; the records come again and the inbox drops them", "err", err)
	}
	return nil
}

// System returns "kafka", the broker the source reads, for telemetry
// (ferrysink.Describer): ferry.Consumer.Consume reports its deliveries
// with it.
func (s *Source) System() string { return "kafka" }
