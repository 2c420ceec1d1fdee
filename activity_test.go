package ferry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
)

// TestActivityIsRecorded: a relay and a consumer record what they did in
// the store, each interval: every event published and applied counted
// once, the failed attempts and the DEAD event too, with latencies.
func TestActivityIsRecorded(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	table := effects(t, drv)
	start := time.Now()
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", MaxAttempts: 2, RetryBase: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond,
		DeadPolicy:   ferry.Continue,
		PollInterval: 20 * time.Millisecond, ActivityInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	evs := events(30, 6)
	poison := evs[7].ID
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		if ev.ID == poison {
			return errors.New("poison")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	relay, err := ferry.NewRelay(drv, c.Sink(), &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, ActivityInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- relay.Run(ctx) }()
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, <-done)
	}()
	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	require.NoError(t, client.Emit(context.Background(), evs...))

	sum := func(kind string) (total ferrydriver.ActivitySample) {
		samples, err := drv.ListActivity(context.Background(), &ferrydriver.ListActivityParams{Since: start, Kind: kind})
		require.NoError(t, err)
		for _, s := range samples {
			total.Done, total.Failed, total.Dead = total.Done+s.Done, total.Failed+s.Failed, total.Dead+s.Dead
			total.LatencyP99 = max(total.LatencyP99, s.LatencyP99)
			total.HandlerP99 = max(total.HandlerP99, s.HandlerP99)
			require.Positive(t, s.Interval)
			require.NotEmpty(t, s.Process)
		}
		return total
	}
	require.Eventually(t, func() bool {
		r, c := sum(ferrydriver.ActivityRelay), sum(ferrydriver.ActivityConsumer)
		return r.Done == 30 && c.Done == 29 && c.Dead == 1
	}, 30*time.Second, 50*time.Millisecond)
	r, cons := sum(ferrydriver.ActivityRelay), sum(ferrydriver.ActivityConsumer)
	require.Zero(t, r.Failed+r.Dead)
	require.Equal(t, int64(2), cons.Failed, "two failed attempts, the second made it DEAD")
	require.Positive(t, r.LatencyP99, "created -> published")
	require.Positive(t, cons.LatencyP99, "created -> applied")
	require.Positive(t, cons.HandlerP99)
}

// TestActivityCarriesTheRelaysLag: a relay's samples carry its feed's lag
// as it last read it, for the console's lag chart: events its sink does
// not take stay behind, and the samples say how many and how old.
func TestActivityCarriesTheRelaysLag(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, client.Emit(context.Background(), events(7, 7)...))
	sink := &hangingSink{release: make(chan struct{})}
	t.Cleanup(func() { close(sink.release) })
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond,
		ActivityInterval: 50 * time.Millisecond, ShutdownTimeout: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	var last *ferrydriver.ActivitySample
	require.Eventually(t, func() bool {
		samples, err := drv.ListActivity(context.Background(), &ferrydriver.ListActivityParams{Since: start, Kind: ferrydriver.ActivityRelay})
		require.NoError(t, err)
		for _, s := range samples {
			if s.LagEvents > 0 {
				last = s
			}
		}
		return last != nil && last.LagAge >= 100*time.Millisecond
	}, 30*time.Second, 20*time.Millisecond, "a sample with the relay's lag")
	require.Equal(t, int64(7), last.LagEvents, "the events the sink never took")
	require.Equal(t, "default/0", last.Name)
}
