package ferry_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// upkeepRelay is quickRelay with retention settings and a registry.
func upkeepRelay(t *testing.T, drv ferrydriver.Store, sink *memsink.Sink, cfg ferry.RelayConfig) (*ferry.Relay, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.HolderID, cfg.PollInterval, cfg.LeaseTTL, cfg.Hooks = "r1", 20*time.Millisecond, 2*time.Second, []ferryhook.Hook{ferryprom.New(reg)}
	cfg.RetryBase, cfg.RetryMax, cfg.HeartbeatInterval, cfg.RetentionInterval = 5*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
	r, err := ferry.NewRelay(drv, sink, &cfg)
	require.NoError(t, err)
	return r, reg
}

// counter reads a counter of reg; with a kind, the series of that kind.
func counter(t *testing.T, reg *prometheus.Registry, name, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := kind == ""
			for _, l := range m.GetLabel() {
				ok = ok || (l.GetName() == "kind" && l.GetValue() == kind)
			}
			if ok {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// statusSpy counts the relay's status reads.
type statusSpy struct {
	ferrydriver.Store
	ferrydriver.KeySeqStore
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
	drv := newPG(t)
	spy := &statusSpy{Store: drv, KeySeqStore: drv}
	run(t, quickRelay(t, spy, &memsink.Sink{}, "r1"))
	require.Eventually(t, func() bool { return spy.lag.Load() >= 3 }, 10*time.Second, 10*time.Millisecond, "the heartbeat measures the lag")
	require.Zero(t, spy.status.Load(), "the heartbeat must not call FeedStatus")
}

// TestRelayRemovesExpiredDeadLetters: dead letters are kept for
// DeadLetterRetention (14 days by default), then the retention pass
// removes them; before, nothing ever did.
func TestRelayRemovesExpiredDeadLetters(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	ctx := context.Background()
	sink := &memsink.Sink{Permanent: func(e *ferryevent.Event) bool { return string(e.Payload) == "poison" }}
	r, reg := upkeepRelay(t, drv, sink, ferry.RelayConfig{DeadLetterRetention: time.Nanosecond})
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	require.NoError(t, c.Emit(ctx, &ferry.Event{Topic: "t", Key: "k", Type: "T", Payload: []byte("poison")}, &ferry.Event{Topic: "t", Key: "k", Type: "T", Payload: []byte("fine")}))
	run(t, r)
	require.Eventually(t, func() bool { return counter(t, reg, "ferry_relay_retention_removed_total", "dead_letters") == 1 }, 10*time.Second, 10*time.Millisecond,
		"the expired dead letter is removed")
	require.Equal(t, 1.0, counter(t, reg, "ferry_relay_dead_letters_total", ""), "it was dead-lettered first")
	dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Empty(t, dls)
}

// TestRelayForgetsIdleDeliveredKeys: the relay forgets the numbers of the
// keys it numbered nothing of for KeyRetention (Retention by default), once
// saved; feed_seqs does not keep a row per key forever, and a forgotten
// key's next event starts at Seq 1, after its earlier ones.
func TestRelayForgetsIdleDeliveredKeys(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	ctx := context.Background()
	sink := &memsink.Sink{}
	r, reg := upkeepRelay(t, drv, sink, ferry.RelayConfig{Retention: time.Nanosecond})
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	first := emitMany(t, c, 60, 6, 2, strconv.Itoa)
	run(t, r)
	keys := func() (n int) {
		require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{drv.Schema()}.Sanitize()+`.feed_seqs`).Scan(&n))
		return n
	}
	// The numbers are saved with the checkpoint, then forgotten: the table
	// is empty before the first save too, so the count of keys forgotten
	// says when it happened.
	require.Eventually(t, func() bool {
		return sink.Len() == len(first) && counter(t, reg, "ferry_relay_retention_removed_total", "keys") >= 6 && keys() == 0
	}, 20*time.Second, 10*time.Millisecond, "idle keys whose events were delivered are forgotten")
	checkDelivery(t, first, sink.Stored(), false)

	again := &ferry.Event{Topic: "orders", Key: "k1", Type: "T", Payload: []byte("again")}
	require.NoError(t, c.Emit(ctx, again))
	require.Eventually(t, func() bool { return sink.Len() == len(first)+1 }, 10*time.Second, 10*time.Millisecond)
	stored := sink.Stored()
	last := stored[len(stored)-1]
	require.Equal(t, again.ID, last.ID, "after every earlier event of k1")
	require.EqualValues(t, 1, last.Seq, "a forgotten key starts again at 1")
}

// TestKeyRetentionDefaultsToRetention: keys are forgotten when their
// events have left the outbox, unless KeyRetention says otherwise; never
// when the outbox is kept forever.
func TestKeyRetentionDefaultsToRetention(t *testing.T) {
	t.Parallel()
	require.Equal(t, 24*time.Hour, (&ferry.RelayConfig{}).WithDefaults().KeyRetention)
	require.Equal(t, time.Hour, (&ferry.RelayConfig{Retention: time.Hour}).WithDefaults().KeyRetention)
	require.Negative(t, (&ferry.RelayConfig{Retention: -1}).WithDefaults().KeyRetention)
	require.Negative(t, (&ferry.RelayConfig{KeyRetention: -1}).WithDefaults().KeyRetention)
	require.Equal(t, 14*24*time.Hour, (&ferry.RelayConfig{}).WithDefaults().DeadLetterRetention)
}

// upkeepBlocker makes one of the relay's upkeep statements wait for its
// context and fail with it, as a driver's statement does when the relay
// stops during it.
type upkeepBlocker struct {
	ferrydriver.Store
	ferrydriver.KeySeqStore
	which   string
	entered chan struct{}
	once    sync.Once
}

func (b *upkeepBlocker) block(ctx context.Context, which string) error {
	if which != b.which {
		return nil
	}
	b.once.Do(func() { close(b.entered) })
	<-ctx.Done()
	return fmt.Errorf("ferrypg: %s: %w", which, ctx.Err())
}

func (b *upkeepBlocker) DeleteDelivered(ctx context.Context, p *ferrydriver.DeleteDeliveredParams) (int64, error) {
	if err := b.block(ctx, "DeleteDelivered"); err != nil {
		return 0, err
	}
	return b.Store.DeleteDelivered(ctx, p)
}

func (b *upkeepBlocker) PruneKeySeqs(ctx context.Context, p *ferrydriver.PruneKeySeqsParams) (*ferrydriver.PruneKeySeqsResult, error) {
	if err := b.block(ctx, "PruneKeySeqs"); err != nil {
		return nil, err
	}
	return b.KeySeqStore.PruneKeySeqs(ctx, p)
}

func (b *upkeepBlocker) DeleteDeadLetters(ctx context.Context, p *ferrydriver.DeleteDeadLettersParams) (int64, error) {
	if err := b.block(ctx, "DeleteDeadLetters"); err != nil {
		return 0, err
	}
	return b.Store.DeleteDeadLetters(ctx, p)
}

func (b *upkeepBlocker) FeedLag(ctx context.Context, p *ferrydriver.FeedLagParams) (*ferrydriver.FeedLag, error) {
	if err := b.block(ctx, "FeedLag"); err != nil {
		return nil, err
	}
	return b.Store.FeedLag(ctx, p)
}

// TestRelayStoppedDuringUpkeepWarnsOfNothing: a relay stopped while one of
// its upkeep statements runs logs no warning (a clean SIGTERM of `ferry run`
// logged "retention failed … context canceled").
func TestRelayStoppedDuringUpkeepWarnsOfNothing(t *testing.T) {
	t.Parallel()
	for _, which := range []string{"DeleteDelivered", "PruneKeySeqs", "DeleteDeadLetters", "FeedLag"} {
		t.Run(which, func(t *testing.T) {
			t.Parallel()
			drv := newPG(t)
			store := &upkeepBlocker{Store: drv, KeySeqStore: drv, which: which, entered: make(chan struct{})}
			var logs syncbuf.Buffer
			r, _ := upkeepRelay(t, store, &memsink.Sink{}, ferry.RelayConfig{
				Retention: time.Nanosecond, KeyRetention: time.Nanosecond, DeadLetterRetention: time.Nanosecond,
				Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
			})
			c, err := ferry.NewClient(drv, nil)
			require.NoError(t, err)
			require.NoError(t, c.Emit(context.Background(), &ferry.Event{Topic: "t", Key: "k", Type: "T"}))
			stop := run(t, r)
			select {
			case <-store.entered:
			case <-time.After(30 * time.Second):
				t.Fatalf("the relay never ran %s", which)
			}
			stop()
			require.Empty(t, logs.String(), "a stop is not a failure")
		})
	}
}
