package ferry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/internal/memsink"
	"github.com/stretchr/testify/require"
)

// statusSpy counts the relay's status reads.
type statusSpy struct {
	ferrydriver.Store
	status, lag atomic.Int64
}

func (s *statusSpy) FeedStatus(ctx context.Context, p *ferrydriver.FeedStatusParams) (*ferrydriver.FeedStatus, error) {
	s.status.Add(1)
	return s.Store.FeedStatus(ctx, p)
}

func (s *statusSpy) FeedLag(ctx context.Context, p *ferrydriver.FeedLagParams) (*ferrydriver.FeedLag, error) {
	s.lag.Add(1)
	return s.Store.FeedLag(ctx, p)
}

// TestRelayHeartbeatDoesNotCount: the heartbeat refreshes the lag through
// FeedLag, whose cost is bounded, and never through FeedStatus, which
// counts dead letters (and, with Exact, the whole lag).
func TestRelayHeartbeatDoesNotCount(t *testing.T) {
	t.Parallel()
	spy := &statusSpy{Store: newPG(t)}
	run(t, quickRelay(t, spy, &memsink.Sink{}, "r1"))
	require.Eventually(t, func() bool { return spy.lag.Load() >= 3 }, 10*time.Second, 10*time.Millisecond, "the heartbeat measures the lag")
	require.Zero(t, spy.status.Load(), "the heartbeat must not call FeedStatus")
}
