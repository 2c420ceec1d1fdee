package ferry

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/stretchr/testify/require"
)

// membersStore answers a Balancer's membership calls: its own lease is
// always granted, and ListLeases lists that many live members.
type membersStore struct {
	ferrydriver.Store
	members atomic.Int64
}

func (s *membersStore) Name() string { return "members" }

func (s *membersStore) AcquireLease(_ context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error) {
	now := time.Now()
	return &ferrydriver.Lease{Name: p.Name, Holder: p.Holder, Term: 1, ExpiresAt: now.Add(p.TTL), Now: now}, nil
}

func (s *membersStore) ListLeases(_ context.Context, prefix string) ([]*ferrydriver.Lease, error) {
	now := time.Now()
	var out []*ferrydriver.Lease
	for i := range s.members.Load() {
		h := string(rune('a' + i))
		out = append(out, &ferrydriver.Lease{Name: prefix + h, Holder: h, Term: 1, ExpiresAt: now.Add(time.Minute), Now: now})
	}
	return out, nil
}

// TestBalancerRefreshDuringAHandoverYieldsNoMore: four partitions led by
// one process, a second member joins: the process hands two over. While
// those relays are still letting go (a slow handover), the next refresh
// must not count their slots as excess again and yield the other two: the
// process keeps leading its share.
func TestBalancerRefreshDuringAHandoverYieldsNoMore(t *testing.T) {
	ctx := context.Background()
	store := &membersStore{}
	store.members.Store(1)
	b, err := NewBalancer(store, &BalancerConfig{Partitions: 4, LeaseTTL: time.Second})
	require.NoError(t, err)
	name := b.prefix() + b.member
	require.NoError(t, b.refresh(ctx, name))
	for p := range 4 {
		require.True(t, b.reserve(ctx, p), "alone, the process leads partition %d", p)
	}
	yielding := func() (out []int) {
		for _, p := range b.Leading() {
			select {
			case <-b.yielding(p):
				out = append(out, p)
			default:
			}
		}
		return out
	}
	store.members.Store(2)
	require.NoError(t, b.refresh(ctx, name))
	require.Equal(t, []int{2, 3}, yielding(), "two members: the two highest partitions are handed over")
	// The handover is slow: partitions 2 and 3 have not let go yet.
	for range 3 {
		require.NoError(t, b.refresh(ctx, name))
	}
	require.Equal(t, []int{2, 3}, yielding(), "refreshes during the handover yield nothing more")
	b.release(2)
	b.release(3)
	require.NoError(t, b.refresh(ctx, name))
	require.Equal(t, []int{0, 1}, b.Leading(), "the process leads its share")
	require.Empty(t, yielding())
}
