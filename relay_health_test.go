package ferry_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
)

// TestRelayHealthSeesAStalledPartition: while the destination answers
// nothing, Health shows the leader with events waiting, a checkpoint that
// does not move and a stuck key (ferry_relay_stuck_key_seconds grows);
// once it answers, the checkpoint moves, nothing waits and no key is
// stuck. A stopped relay no longer leads.
func TestRelayHealthSeesAStalledPartition(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	release := make(chan struct{})
	var once sync.Once
	sink := &memsink.Sink{OnPublish: func(ctx context.Context, _ []*ferryevent.Event) {
		select {
		case <-release:
		case <-ctx.Done():
		}
	}}
	reg := prometheus.NewRegistry()
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{
		HolderID: "health", PollInterval: 20 * time.Millisecond, LeaseTTL: 10 * time.Second,
		RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		StallTimeout: 200 * time.Millisecond, Hooks: []ferryhook.Hook{ferryprom.New(reg)},
	})
	require.NoError(t, err)
	h := relay.Health()
	require.Equal(t, "default/0", h.Feed)
	require.False(t, h.Running)
	require.False(t, h.Leading)

	stop := run(t, relay)
	defer once.Do(func() { close(release) })
	require.Eventually(t, func() bool { return relay.Health().Leading }, 30*time.Second, 10*time.Millisecond)
	require.True(t, relay.Health().Running)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		require.NoError(t, client.Emit(ctx, &ferry.Event{Topic: "t", Key: k, Type: "T"}))
	}
	require.Eventually(t, func() bool {
		h := relay.Health()
		return h.Waiting >= 3 && h.StuckKey != "" && time.Since(h.StuckSince) > 300*time.Millisecond
	}, 30*time.Second, 10*time.Millisecond, "the hung events wait and their keys are stuck")
	moved := relay.Health().Moved
	// Several heartbeats and delivery-loop turns later, the checkpoint
	// still has not moved, and the loop still turns.
	turned := relay.Health().Turned
	require.Eventually(t, func() bool { return relay.Health().Turned.After(turned.Add(300 * time.Millisecond)) }, 30*time.Second, 10*time.Millisecond)
	h = relay.Health()
	require.Equal(t, moved, h.Moved, "the checkpoint did not move while every event hangs")
	require.Positive(t, h.Waiting)
	require.Positive(t, gaugeValue(t, reg, "ferry_relay_stuck_key_seconds"), "the stuck key's age is exported")

	resumed := time.Now()
	once.Do(func() { close(release) })
	require.Eventually(t, func() bool {
		h := relay.Health()
		return h.Moved.After(resumed) && h.Waiting == 0 && h.StuckKey == ""
	}, 30*time.Second, 10*time.Millisecond, "the checkpoint moves once the destination answers")
	require.Len(t, sink.Stored(), 3)
	require.Eventually(t, func() bool { return gaugeValue(t, reg, "ferry_relay_stuck_key_seconds") == 0 }, 30*time.Second, 10*time.Millisecond)

	stop()
	h = relay.Health()
	require.False(t, h.Running)
	require.False(t, h.Leading)
	require.Zero(t, h.Waiting)
}

// gaugeValue returns the value of the gauge name in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s is not registered", name)
	return 0
}
