package ferry

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
)

// RelayConfig configures a Relay. The zero value (or nil) gives the defaults.
type RelayConfig struct {
	// Feed names the outbox feed; the checkpoint and the lease are stored
	// under "<Feed>/<Partition>". Default "default".
	Feed string
	// Partition is the outbox partition this relay reads. Default 0.
	Partition int
	// HolderID names this relay in the lease. Each Run adds a suffix of its
	// own ("<HolderID>#<random>"), so that relays given the same name (one
	// FERRY_HOLDER for every replica) still hold the lease one at a time.
	// Default: host-pid-random.
	HolderID string
	// BatchSize is the most events read and published at once. Default 500.
	BatchSize int
	// PollInterval is the longest a committed event waits before the relay
	// looks for it when no wake-up arrives. Default 500 ms.
	PollInterval time.Duration
	// LeaseTTL is how long the relay's lease lasts without renewal; a
	// standby takes over within about this long after the leader dies. The
	// leader renews every LeaseTTL/3 and stops publishing when it could not
	// renew for LeaseTTL minus a safety margin, on its local monotonic clock.
	// Default 15 s; minimum 1 s.
	LeaseTTL time.Duration
	// RetryBase and RetryMax bound the backoff between publish attempts and
	// after database errors. Defaults 100 ms and 30 s.
	RetryBase, RetryMax time.Duration
	// Retention is how long published events stay in the outbox. Default
	// 24 h; a negative value keeps them forever.
	Retention time.Duration
	// RetentionInterval is how often delivered events are removed. Default 1 min.
	RetentionInterval time.Duration
	// HeartbeatInterval is how often an idle relay still saves its checkpoint
	// and refreshes its lag figures. Default 5 s.
	HeartbeatInterval time.Duration
	// ShutdownTimeout bounds how long Run takes to return once its context
	// is cancelled, whatever the sink and the database do: the batch in
	// flight is published until the last quarter of it (at most 2 s of it)
	// begins, then what was acknowledged is checkpointed and the lease is
	// released. A publish the sink does not finish by then is abandoned
	// (its events are redelivered by the next leader). Default 10 s.
	ShutdownTimeout time.Duration
	// Logger receives the relay's logs. Default: slog.Default().
	Logger *slog.Logger
	// Hooks observe the relay (see Hook): each PublishHook hears of every
	// event it publishes, when the sink answers (a tracing hook, ferryotel,
	// records a publish span there); each MetricsHook records its metrics
	// (ferryprom.New(registerer) for Prometheus).
	Hooks []ferryhook.Hook
	// DeadLetterRetention is how long the relay keeps the events it
	// dead-lettered (`ferry dlq list|show|redrive|discard`); its retention
	// pass, every RetentionInterval, removes older ones. Default 14 days; a
	// negative value keeps them forever.
	DeadLetterRetention time.Duration
	// KeyRetention is how long a key must have had no new event, with
	// every event of it delivered, before the retention pass forgets its
	// sequence: the key's next event starts Seq at 1 again (see
	// ferryevent.Event.Seq), and the table of key sequences stays bounded
	// (where the relay numbers events, ferrydriver.KeySeqStore: how long
	// the relay has numbered none of the key's events).
	// Default: Retention, so that a key is forgotten about when its events
	// have left the outbox; a negative value never forgets a key (Seq
	// never restarts, and the table keeps a row for every key ever used).
	KeyRetention time.Duration

	// StallTimeout is how long a key's event may go unacknowledged (in
	// flight, or failing and retried) while the destination acknowledges
	// other keys, before the key is parked: its events are set aside in the
	// store and published from there, in order, once it recovers, so that
	// the checkpoint and the other keys move on. When the relay's
	// read-ahead window is full, a tenth of it. Default 2 s.
	StallTimeout time.Duration
	// MaxAttempts and MaxAge bound how long the relay retries one event
	// that fails transiently: after MaxAttempts attempts, or MaxAge after
	// its first one, DeadPolicy applies. Defaults 0 and 0: retry forever
	// (a destination that is down for a day is delivered to when it comes
	// back). A parked key's attempts and the time of its first are stored
	// with it, and count across leaderships; a key not parked yet starts
	// afresh with a new leader.
	MaxAttempts int
	MaxAge      time.Duration
	// DeadPolicy says what happens when a key's event reaches MaxAttempts
	// or MaxAge: Hold (the default) parks the key and holds it: its event
	// is not retried and its later events wait until an operator releases
	// it (`ferry parked release`); Continue dead-letters the event and goes
	// on with the key's next one.
	DeadPolicy DeadPolicy
	// DisableParking keeps stuck keys in memory instead of parking them (a
	// stuck key then holds the checkpoint, and once the read-ahead window
	// of two batches is full, every key), and makes DeadPolicy Hold
	// dead-letter. The relay still publishes what is parked in the store for
	// its feed: redriven dead letters (ferrydriver.Store.RedriveDeadLetters)
	// and what a relay that parked left there.
	DisableParking bool
	// OnStuckKey, when set, is called when a key is parked, held or has an
	// event dead-lettered (by DeadPolicy, or a parked key's event that the
	// sink refused for good), from the relay's delivery loop: it must not
	// block (hand the alert off).
	OnStuckKey func(ctx context.Context, k *StuckKey)
	// Balancer, when set, shares the feed's partitions among the processes
	// that run relays for them: give every Relay of a process the same one
	// and run it (see Balancer). Without it every relay competes for its
	// partition's lease, and one process may lead them all.
	Balancer *Balancer
	// ActivityInterval is how often the relay records what it did (events
	// published, failed and dead-lettered, commit → publish latency) in a
	// store that keeps it (ferrydriver.Admin), for the console's
	// series. Default 10 s; negative: never.
	ActivityInterval time.Duration
}

// StuckKey describes a key whose destination does not acknowledge it.
type StuckKey struct {
	Feed, Key string
	// Event is the key's oldest event not acknowledged.
	Event ferryevent.Event
	State KeyState
	// Attempts is the number of failed attempts of Event, Since the time
	// of its first one.
	Attempts int
	Since    time.Time
	// Err is the last publish error; nil when the event hung.
	Err error
}

// KeyState is what happened to a stuck key.
type KeyState string

const (
	// KeyParked: the key's events are set aside and retried from the store.
	KeyParked KeyState = "parked"
	// KeyHeld: DeadPolicy Hold stopped retrying the key until released.
	KeyHeld KeyState = "held"
	// KeyDeadLettered: DeadPolicy Continue dead-lettered the event.
	KeyDeadLettered KeyState = "dead-lettered"
)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *RelayConfig) WithDefaults() RelayConfig {
	out := RelayConfig{}
	if c != nil {
		out = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if out.Feed == "" {
		out.Feed = "default"
	}
	if out.HolderID == "" {
		host, _ := os.Hostname()
		out.HolderID = fmt.Sprintf("%s-%d-%04x", host, os.Getpid(), rand.IntN(1<<16))
	}
	if out.BatchSize == 0 {
		out.BatchSize = 500
	}
	def(&out.PollInterval, 500*time.Millisecond)
	def(&out.LeaseTTL, 15*time.Second)
	def(&out.RetryBase, 100*time.Millisecond)
	def(&out.RetryMax, 30*time.Second)
	def(&out.Retention, 24*time.Hour)
	def(&out.RetentionInterval, time.Minute)
	def(&out.HeartbeatInterval, 5*time.Second)
	def(&out.ShutdownTimeout, 10*time.Second)
	def(&out.StallTimeout, 2*time.Second)
	def(&out.DeadLetterRetention, 14*24*time.Hour)
	def(&out.KeyRetention, out.Retention)
	def(&out.ActivityInterval, defaultActivityInterval)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *RelayConfig) validate() error {
	switch {
	case c.BatchSize < 1:
		return fmt.Errorf("ferry: RelayConfig.BatchSize is %d: use at least 1 (default 500)", c.BatchSize)
	case c.ActivityInterval > 0 && c.ActivityInterval < 10*time.Millisecond:
		return fmt.Errorf("ferry: RelayConfig.ActivityInterval is %v: use at least 10ms, or a negative value for none (default %v)", c.ActivityInterval, defaultActivityInterval)
	case c.Partition < 0:
		return fmt.Errorf("ferry: RelayConfig.Partition is %d: partitions are numbered from 0", c.Partition)
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("ferry: RelayConfig.PollInterval is %v: use at least 1ms (default 500ms)", c.PollInterval)
	case c.LeaseTTL < time.Second:
		return fmt.Errorf("ferry: RelayConfig.LeaseTTL is %v: use at least 1s (default 15s)", c.LeaseTTL)
	case c.RetryBase <= 0 || c.RetryMax < c.RetryBase:
		return fmt.Errorf("ferry: RelayConfig.RetryBase (%v) must be positive and at most RetryMax (%v)", c.RetryBase, c.RetryMax)
	case c.StallTimeout < 10*time.Millisecond:
		return fmt.Errorf("ferry: RelayConfig.StallTimeout is %v: use at least 10ms (default 2s)", c.StallTimeout)
	case c.MaxAttempts < 0 || c.MaxAge < 0:
		return fmt.Errorf("ferry: RelayConfig.MaxAttempts (%d) and MaxAge (%v) must not be negative (0: retry forever)", c.MaxAttempts, c.MaxAge)
	case c.DeadPolicy != Hold && c.DeadPolicy != Continue:
		return fmt.Errorf("ferry: RelayConfig.DeadPolicy %d is not Hold or Continue", c.DeadPolicy)
	case c.Balancer != nil && (c.Balancer.cfg.Feed != c.Feed || c.Partition >= c.Balancer.cfg.Partitions):
		return fmt.Errorf("ferry: RelayConfig.Balancer shares feed %q's %d partitions; this relay is partition %d of feed %q", c.Balancer.cfg.Feed, c.Balancer.cfg.Partitions, c.Partition, c.Feed)
	case c.RetentionInterval <= 0 || c.HeartbeatInterval <= 0 || c.ShutdownTimeout <= 0:
		return fmt.Errorf("ferry: RelayConfig.RetentionInterval, HeartbeatInterval and ShutdownTimeout must be positive")
	}
	return nil
}
