package ferrykafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// Defaults applied by Config.WithDefaults.
const (
	// DefaultMaxMessageBytes is Kafka's default message.max.bytes (1 MiB
	// plus the record batch overhead), rounded down to 1 MiB.
	DefaultMaxMessageBytes = 1 << 20
	// DefaultDeliveryTimeout bounds how long the client keeps retrying a
	// record before failing it (and every later record of its partition).
	DefaultDeliveryTimeout = 30 * time.Second
)

// Config configures a Sink. Brokers is required.
type Config struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string

	// TopicPrefix is put before each event's Topic to name its Kafka topic,
	// when Topic is nil. Default "" (the Kafka topic is the event Topic).
	TopicPrefix string
	// Topic, when set, names the Kafka topic of each event instead.
	Topic func(ev *ferryevent.Event) string

	// MaxMessageBytes is the largest record the sink sends; a larger event
	// fails at once with a ferrysink.PermanentError (the relay dead-letters
	// it). Keep it at or below the topic's max.message.bytes. Default
	// DefaultMaxMessageBytes.
	MaxMessageBytes int

	// DeliveryTimeout bounds how long a record is retried inside the client
	// before it fails (kgo.RecordDeliveryTimeout). Default
	// DefaultDeliveryTimeout.
	DeliveryTimeout time.Duration

	// ClientOptions are passed to kgo.NewClient after Ferry's own, for SASL
	// (kgo.SASL), TLS (kgo.DialTLSConfig), client ID, and so on. Options
	// that would weaken delivery (acks other than all, idempotence off, a
	// partitioner that ignores the key) are the caller's responsibility.
	ClientOptions []kgo.Opt

	// Logger receives warnings. Default: discard.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with defaults filled in.
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.MaxMessageBytes == 0 {
		out.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if out.DeliveryTimeout == 0 {
		out.DeliveryTimeout = DefaultDeliveryTimeout
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return &out
}

func (c *Config) validate() error {
	if err := checkBrokers("Config", c.Brokers); err != nil {
		return err
	}
	if c.MaxMessageBytes < 1024 {
		return fmt.Errorf("ferrykafka: Config.MaxMessageBytes %d is too small: use at least 1024, at most the topic's max.message.bytes", c.MaxMessageBytes)
	}
	if c.DeliveryTimeout < time.Second {
		return fmt.Errorf("ferrykafka: Config.DeliveryTimeout %v is too short: use at least 1s", c.DeliveryTimeout)
	}
	return nil
}

// Sink publishes events to Kafka with an idempotent producer (acks=all,
// in order per partition across the client's retries), partitioning by
// the event Key with Kafka's default (murmur2) partitioner, so that Java
// producers and Ferry put a key on the same partition.
//
// It is an ferrysink.OrderedBatcher: the relay may send several events of
// one key in one call. When a record fails, the client fails every later
// record of its partition too, so no event is acknowledged after an
// earlier one of its key failed.
type Sink struct {
	cfg    *Config
	client *kgo.Client
	guard  *ferrysink.WriteGuard // wraps every broker connection

	mu     sync.RWMutex // held for reading by Publish, for writing by Close
	closed bool
}

var (
	_ ferrysink.Sink           = (*Sink)(nil)
	_ ferrysink.OrderedBatcher = (*Sink)(nil)
)

// New connects to the brokers and checks that they answer.
func New(ctx context.Context, cfg *Config) (*Sink, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // murmur2, as the Java client
		kgo.RecordDeliveryTimeout(c.DeliveryTimeout),
		kgo.ProducerBatchMaxBytes(int32(max(c.MaxMessageBytes+1024, 1<<20))),
		kgo.ProducerLinger(0),
		kgo.UnknownTopicRetries(3),
		// Lets a record's context fail it while buffered or in flight:
		// the relay's fence (see fencedContext) and the delivery timeout
		// need it with an idempotent producer. The cost franz-go warns of,
		// a failed record that did land being stored twice when retried,
		// is the relay's at-least-once contract anyway (consumers dedup by
		// event ID), and the retry comes before the key's next event.
		kgo.AllowIdempotentProduceCancellation(),
	}, c.ClientOptions...)
	guard := ferrysink.NewWriteGuard()
	dial, err := guardedDialer(c, guard)
	if err != nil {
		return nil, err
	}
	// Last, so that the guard wraps whatever dialer or TLS the caller set.
	opts = append(opts, kgo.DialTLSConfig(nil), kgo.Dialer(dial))
	client, err := connect(ctx, c.Brokers, opts)
	if err != nil {
		return nil, err
	}
	return &Sink{cfg: c, client: client, guard: guard}, nil
}

// guardedDialer returns the dialer the caller's ClientOptions configure
// (kgo.Dialer, or kgo.DialTLSConfig over a plain dialer with kgo.DialTimeout),
// its connections wrapped in guard: a write then carries no record whose
// relay fence has ended, even one franz-go buffered before the relay was
// paused.
func guardedDialer(c *Config, guard *ferrysink.WriteGuard) (func(context.Context, string, string) (net.Conn, error), error) {
	// A client that never dials reads the options back.
	probe, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, c.ClientOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("ferrykafka: Config.ClientOptions: %w", err)
	}
	base, _ := probe.OptValue(kgo.Dialer).(func(context.Context, string, string) (net.Conn, error))
	tlsConfig, _ := probe.OptValue(kgo.DialTLSConfig).(*tls.Config)
	timeout, _ := probe.OptValue(kgo.DialTimeout).(time.Duration)
	probe.Close()
	if base == nil {
		nd := &net.Dialer{Timeout: timeout}
		base = nd.DialContext
		if tlsConfig != nil {
			base = func(ctx context.Context, network, host string) (net.Conn, error) {
				cfg := tlsConfig.Clone()
				if cfg.ServerName == "" {
					if server, _, err := net.SplitHostPort(host); err == nil {
						cfg.ServerName = server
					}
				}
				return (&tls.Dialer{NetDialer: nd, Config: cfg}).DialContext(ctx, network, host)
			}
		}
	}
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		conn, err := base(ctx, network, host)
		if err != nil {
			return nil, err
		}
		return guard.Conn(conn), nil
	}, nil
}

// checkBrokers checks a config's seed brokers (cfg names the config type).
func checkBrokers(cfg string, brokers []string) error {
	if len(brokers) == 0 {
		return fmt.Errorf("ferrykafka: %s.Brokers is empty: list at least one seed broker, host:port", cfg)
	}
	for _, b := range brokers {
		if strings.TrimSpace(b) == "" || strings.Contains(b, "://") {
			return fmt.Errorf("ferrykafka: %s.Brokers: %q is not host:port", cfg, b)
		}
	}
	return nil
}

// connect creates a client and checks that a broker answers.
func connect(ctx context.Context, brokers []string, opts []kgo.Opt) (*kgo.Client, error) {
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("ferrykafka: %w", err)
	}
	if err := client.Ping(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("ferrykafka: no broker of %v answers: %w", brokers, err)
	}
	return client, nil
}

// OrderedBatches implements ferrysink.OrderedBatcher.
func (s *Sink) OrderedBatches() bool { return true }

func (s *Sink) topic(ev *ferryevent.Event) string {
	if s.cfg.Topic != nil {
		return s.cfg.Topic(ev)
	}
	return s.cfg.TopicPrefix + ev.Topic
}

// errClosed is each event's result after Close.
var errClosed = errors.New("ferrykafka: the sink is closed")

// Publish implements ferrysink.Sink: it produces every event and waits for
// the brokers' acknowledgements (all in-sync replicas). It returns when
// every event has an outcome or ctx ends; records already sent when ctx
// ends may still be stored, and the relay publishes them again.
func (s *Sink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	return s.publish(ctx, events, nil)
}

// PublishEach implements ferrysink.EachPublisher: each record's outcome is
// reported when its produce request is answered, so a partition without a
// leader holds back only the keys it holds.
func (s *Sink) PublishEach(ctx context.Context, events []*ferryevent.Event, report func(int, error)) []error {
	return s.publish(ctx, events, report)
}

func (s *Sink) publish(ctx context.Context, events []*ferryevent.Event, report func(int, error)) []error {
	out := ferrysink.NewOutcomes(len(events), report)
	errs := out.Errs()
	if len(events) == 0 {
		return errs
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		for i := range errs {
			errs[i] = errClosed
		}
		return out.Finish()
	}
	type outcome struct {
		i   int
		err error
	}
	// Buffered for every promise, so that promises never block, even
	// after Publish returned on a cancelled context.
	results := make(chan outcome, len(events))
	// The records carry the relay's fence into the client: franz-go looks
	// at a batch's context when it builds a produce request, so a leader
	// paused with records still buffered fails them on resume instead of
	// sending them.
	fenceCtx := context.Context(fencedContext{ctx})
	// And every write to a broker checks the fences of the records not
	// yet answered, in case one was put in a request before a pause.
	guarded := s.guard.Call(ctx)
	pending := 0
	done := make([]bool, len(events))
	for i, ev := range events {
		rec, err := encode(ev, s.topic(ev))
		if err != nil {
			errs[i], done[i] = err, true
			continue
		}
		if n := size(rec); n > s.cfg.MaxMessageBytes {
			errs[i] = ferrysink.Permanent(fmt.Sprintf("event is %d bytes, more than the %d a Kafka record may carry here (MaxMessageBytes)", n, s.cfg.MaxMessageBytes), nil)
			done[i] = true
			continue
		}
		if _, err := guarded.Arm(); err != nil {
			errs[i] = fmt.Errorf("ferrykafka: event %s %w", ev.ID, err)
			done[i] = true
			continue
		}
		pending++
		s.client.Produce(fenceCtx, rec, func(_ *kgo.Record, err error) {
			guarded.Disarm()
			results <- outcome{i, err}
		})
	}
	for pending > 0 {
		select {
		case o := <-results:
			done[o.i] = true
			out.Set(o.i, s.classify(events[o.i], o.err))
			pending--
		case <-ctx.Done():
			for i := range errs {
				if !done[i] {
					errs[i] = ctx.Err()
				}
			}
			return out.Finish()
		}
	}
	return out.Finish()
}

// classify turns a produce error into a relay outcome.
func (s *Sink) classify(ev *ferryevent.Event, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		return ferrysink.Permanent(fmt.Sprintf("Kafka topic %q does not exist: create it, or map the event topic %q to one that does", s.topic(ev), ev.Topic), err)
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return ferrysink.Permanent("the broker refused the record as too large: lower MaxMessageBytes to the topic's max.message.bytes", err)
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.CorruptMessage):
		return ferrysink.Permanent("the broker refused the record", err)
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return fmt.Errorf("ferrykafka: not authorized to write topic %q (grant WRITE; retried until then): %w", s.topic(ev), err)
	}
	return fmt.Errorf("ferrykafka: produce to %q: %w", s.topic(ev), err)
}

// System returns "kafka", the kind of destination, for telemetry
// (ferrysink.Describer).
func (s *Sink) System() string { return "kafka" }

// Close flushes the records in flight, then closes the client. Publish
// calls in progress finish first. Calling it again does nothing.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.client.Flush(ctx)
	s.client.Close()
	if err != nil {
		return fmt.Errorf("ferrykafka: flush before close: %w", err)
	}
	return nil
}

// Murmur2 is the 32-bit murmur2 hash Kafka's Java client uses to pick a
// key's partition (Utils.murmur2, seed 0x9747b28c).
func Murmur2(data []byte) uint32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	n := len(data)
	h := uint32(seed) ^ uint32(n)
	for ; len(data) >= 4; data = data[4:] {
		k := uint32(data[0]) | uint32(data[1])<<8 | uint32(data[2])<<16 | uint32(data[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(data) {
	case 3:
		h ^= uint32(data[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// Partition is the partition, of n, that Kafka's default partitioner (and
// this sink) gives a key: murmur2(key) & 0x7fffffff % n.
func Partition(key []byte, n int32) int32 {
	return int32(Murmur2(key)&0x7fffffff) % n
}

// fencedContext is a record's context whose Done and Err also report the
// relay's fence (ferrysink.Fenced), checked when asked: franz-go asks when
// it puts a buffered batch into a produce request, which is after a pause
// however long, so the check needs no timer to have fired.
type fencedContext struct{ context.Context }

var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c fencedContext) Done() <-chan struct{} {
	if ferrysink.Fenced(c.Context) != nil {
		return closedDone
	}
	return c.Context.Done()
}

func (c fencedContext) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if err := ferrysink.Fenced(c.Context); err != nil {
		return fmt.Errorf("%w: %w", context.Canceled, err)
	}
	return nil
}
