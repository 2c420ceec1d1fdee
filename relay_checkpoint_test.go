package ferry_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/stretchr/testify/require"
)

// savesStore records when the relay's checkpoint saves started, and the
// last one.
type savesStore struct {
	ferrydriver.Store
	ferrydriver.KeySeqStore
	mu    sync.Mutex
	saves []time.Time
	last  ferrydriver.SaveCheckpointParams
}

func (s *savesStore) SaveCheckpoint(ctx context.Context, p *ferrydriver.SaveCheckpointParams) error {
	at := time.Now()
	err := s.Store.SaveCheckpoint(ctx, p)
	if err == nil {
		s.mu.Lock()
		s.saves = append(s.saves, at)
		s.last = *p
		s.mu.Unlock()
	}
	return err
}

// savedBetween counts the saves that started from start to end.
func (s *savesStore) savedBetween(start, end time.Time) (n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, at := range s.saves {
		if !at.Before(start) && !at.After(end) {
			n++
		}
	}
	return n
}

// savedAll reports whether a feed opened at the last saved cursor reads
// nothing more; false before any save, or if the look failed (it runs
// inside require.Eventually, whose condition must not end the test).
func (s *savesStore) savedAll(t *testing.T) bool {
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	if last.Feed == "" {
		return false
	}
	ctx := context.Background()
	f, err := s.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: last.Feed, Partition: last.Partition, Cursor: last.Cursor})
	if err != nil {
		t.Logf("open the feed at the saved cursor: %v", err)
		return false
	}
	defer f.Close()
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 1000, Wait: time.Millisecond})
	if err != nil {
		t.Logf("read the feed at the saved cursor: %v", err)
		return false
	}
	return len(b.Events) == 0
}

// TestRelayCoalescesSavesWhileEventsKeepComing: events committed one at a
// time, a millisecond apart, come in batches of a few; the relay saved the
// checkpoint after each, a statement and a commit per batch. It now saves
// at most every 20 ms while they keep coming, and the last save still
// covers the last event.
func TestRelayCoalescesSavesWhileEventsKeepComing(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ctx := context.Background()
	store := &savesStore{Store: drv, KeySeqStore: drv}
	sink := &memsink.Sink{}
	r, err := ferry.NewRelay(store, sink, &ferry.RelayConfig{
		HolderID: "r", PollInterval: 20 * time.Millisecond, LeaseTTL: 5 * time.Second, HeartbeatInterval: time.Minute,
	})
	require.NoError(t, err)
	run(t, r)
	const n = 300
	var emitted []*ferry.Event
	start := time.Now()
	for i := range n {
		ev := &ferry.Event{Topic: "t", Key: "k" + strconv.Itoa(i%7), Type: "T"}
		require.NoError(t, c.Emit(ctx, ev))
		emitted = append(emitted, ev)
		time.Sleep(time.Millisecond)
	}
	require.Eventually(t, func() bool { return sink.Len() >= n }, 30*time.Second, 5*time.Millisecond)
	delivered := time.Now()
	checkDelivery(t, emitted, sink.Stored(), false)
	saves := store.savedBetween(start, delivered)
	// A slower machine only lengthens the window, and so the bound.
	bound := int(delivered.Sub(start)/(20*time.Millisecond)) + 2
	t.Logf("%d saves for %d events in %v (at most %d)", saves, n, delivered.Sub(start).Round(time.Millisecond), bound)
	require.LessOrEqual(t, saves, bound, "saves while events keep coming are 20 ms apart")
	require.Eventually(t, func() bool { return store.savedAll(t) }, 10*time.Second, 20*time.Millisecond,
		"the events delivered last are saved without waiting for the heartbeat")
}
