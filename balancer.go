package ferry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// BalancerConfig configures a Balancer.
type BalancerConfig struct {
	// Feed is the feed whose partitions are shared. Default "default".
	Feed string
	// Partitions is the number of outbox partitions (one Relay each).
	Partitions int
	// HolderID names this process among the members; a random suffix is
	// added. Default: host-pid.
	HolderID string
	// LeaseTTL is the membership lease's lifetime, as the relays' LeaseTTL:
	// a process that dies stops counting after it. Default 15 s.
	LeaseTTL time.Duration
	// Logger receives the balancer's logs. Default: slog.Default().
	Logger *slog.Logger
}

// Balancer shares a feed's partitions fairly among the processes that run
// relays for them: each process runs one Relay per partition with the
// same Balancer (RelayConfig.Balancer), and each leads at most
// ceil(partitions / live processes) of them. A process that joins makes
// the others hand partitions over (each gracefully: its checkpoint saved,
// its lease released); one that dies stops counting once its membership
// lease expires, and the others take its partitions over when their
// leases do. Leases still decide who leads: two leaders of one partition
// are impossible whatever the balancer thinks.
//
// Membership is a lease per process named "members/<feed>/<holder>". Run
// must run while the relays do.
type Balancer struct {
	store  memberLeases
	cfg    BalancerConfig
	unit   string // what it balances, for the logs: "partition", "share"
	member string
	log    *slog.Logger

	mu sync.Mutex // guards the fields below
	// leading holds the partitions this process leads or is about to try;
	// yield those it must hand over (closed when it must).
	leading map[int]chan struct{}
	members int
	ready   chan struct{} // closed after the first membership count
	once    sync.Once
}

// NewBalancer returns a balancer over store's leases.
func NewBalancer(store ferrydriver.Store, cfg *BalancerConfig) (*Balancer, error) {
	c := BalancerConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Feed == "" {
		c.Feed = "default"
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 15 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.HolderID == "" {
		c.HolderID = defaultHolder()
	}
	switch {
	case c.Partitions < 1:
		return nil, fmt.Errorf("ferry: BalancerConfig.Partitions is %d: give the outbox's partition count", c.Partitions)
	case c.LeaseTTL < time.Second:
		return nil, fmt.Errorf("ferry: BalancerConfig.LeaseTTL is %v: use at least 1s, as the relays' LeaseTTL", c.LeaseTTL)
	}
	return newBalancer(store, c, "partition"), nil
}

// memberLeases are the leases a Balancer keeps its membership with.
type memberLeases interface {
	AcquireLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error)
	GetLease(ctx context.Context, name string) (*ferrydriver.Lease, error)
	ReleaseLease(ctx context.Context, p *ferrydriver.LeaseParams) error
	ListLeases(ctx context.Context, prefix string) ([]*ferrydriver.Lease, error)
}

// newBalancer returns a balancer of c.Partitions units (a feed's
// partitions, a source's shares) over leases, c with its defaults.
func newBalancer(leases memberLeases, c BalancerConfig, unit string) *Balancer {
	b := &Balancer{store: leases, cfg: c, unit: unit, leading: map[int]chan struct{}{}, members: 1, ready: make(chan struct{})}
	b.member = fmt.Sprintf("%s#%08x", c.HolderID, rand.Uint32())
	b.log = c.Logger.With("feed", c.Feed, "member", b.member)
	return b
}

func (b *Balancer) prefix() string { return "members/" + b.cfg.Feed + "/" }

// target is the most partitions this process should lead.
func (b *Balancer) target() int { return (b.cfg.Partitions + b.members - 1) / b.members }

// Run keeps this process's membership and rebalances every LeaseTTL/3
// until ctx ends; then it gives the membership up and returns nil.
func (b *Balancer) Run(ctx context.Context) error {
	name := b.prefix() + b.member
	tick := time.NewTicker(b.cfg.LeaseTTL / 3)
	defer tick.Stop()
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if l, err := b.store.GetLease(rctx, name); err == nil {
			_ = b.store.ReleaseLease(rctx, &ferrydriver.LeaseParams{Name: name, Holder: b.member, Term: l.Term})
		}
	}()
	for {
		if err := b.refresh(ctx, name); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ferrydriver.ErrSchemaMissing) {
				return err
			}
			b.log.Warn("ferry: balancer cannot reach its store; keeping the last membership count", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// refresh renews the membership, counts the live members and asks relays
// over the target to hand partitions over.
func (b *Balancer) refresh(ctx context.Context, name string) error {
	if _, err := b.store.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: b.member, TTL: b.cfg.LeaseTTL}); err != nil {
		return err
	}
	leases, err := b.store.ListLeases(ctx, b.prefix())
	if err != nil {
		return err
	}
	live := 0
	for _, l := range leases {
		if l.Held(l.Holder) {
			live++
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if live != b.members {
		b.log.Info("ferry: group membership changed", "members", max(live, 1), b.unit+"s", b.cfg.Partitions, "target_per_member", (b.cfg.Partitions+max(live, 1)-1)/max(live, 1))
	}
	b.members = max(live, 1)
	b.once.Do(func() { close(b.ready) })
	// Hand the excess over, highest partitions first: the others take them
	// within their standby interval.
	var held []int
	for p, ch := range b.leading {
		if ch != nil {
			held = append(held, p)
		}
	}
	// Slots already yielding (nil) are on their way out: only the ones
	// still held count against the target, or a refresh during a slow
	// handover would yield the process's own share too.
	if excess := len(held) - b.target(); excess > 0 {
		sort.Sort(sort.Reverse(sort.IntSlice(held)))
		for _, p := range held[:min(excess, len(held))] {
			b.log.Info("ferry: handing a "+b.unit+" over to balance the group", b.unit, p, "members", b.members)
			close(b.leading[p])
			b.leading[p] = nil // keeps its slot until the relay has let go
		}
	}
	return nil
}

// reserve lets the relay of partition p try for its lease if this process
// leads fewer than its share; the relay calls release when it stops
// leading or did not get the lease.
func (b *Balancer) reserve(ctx context.Context, p int) bool {
	select {
	case <-b.ready:
	case <-ctx.Done():
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.leading[p]; ok || len(b.leading) >= b.target() {
		return false
	}
	b.leading[p] = make(chan struct{})
	return true
}

// yielding returns a channel closed when partition p must be handed over.
func (b *Balancer) yielding(p int) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ch := b.leading[p]; ch != nil {
		return ch
	}
	closed := make(chan struct{})
	close(closed)
	return closed
}

func (b *Balancer) release(p int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.leading, p)
}

// Leading returns the partitions this process leads or is trying for.
func (b *Balancer) Leading() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]int, 0, len(b.leading))
	for p := range b.leading {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

// defaultHolder is host-pid, the default holder name.
func defaultHolder() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}
