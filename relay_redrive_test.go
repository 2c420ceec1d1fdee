package ferry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/stretchr/testify/require"
)

// feedRelay is a quick relay of feed on drv into sink.
func feedRelay(t *testing.T, drv ferrydriver.Store, sink *memsink.Sink, feed string) *ferry.Relay {
	t.Helper()
	r, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{
		Feed: feed, HolderID: feed, PollInterval: 20 * time.Millisecond, LeaseTTL: 5 * time.Second,
		RetryBase: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond,
		StallTimeout: time.Minute, // no key is parked for being slow here
	})
	require.NoError(t, err)
	return r
}

// payloadsOf returns the payloads stored for key, in order.
func payloadsOf(s *memsink.Sink, key string) []string {
	var out []string
	for _, e := range s.Stored() {
		if e.Key == key {
			out = append(out, string(e.Payload))
		}
	}
	return out
}

// TestRedriveGoesToTheFeedThatDeadLetteredIt: two feeds relay one outbox
// to two destinations; feed a's refuses an event, which a dead-letters,
// and b's takes it. Redriven, the event goes to a's destination, with its
// ID and Seq, and b's receives nothing new: the redrive appends nothing to
// the outbox that every feed reads (it used to, and every feed published
// it again).
func TestRedriveGoesToTheFeedThatDeadLetteredIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	var refusing atomic.Bool
	refusing.Store(true)
	sinkA := &memsink.Sink{Permanent: func(e *ferryevent.Event) bool { return refusing.Load() && string(e.Payload) == "refused" }}
	sinkB := &memsink.Sink{}
	run(t, feedRelay(t, drv, sinkA, "a"))
	run(t, feedRelay(t, drv, sinkB, "b"))

	refused := &ferry.Event{Topic: "orders", Key: "K", Type: "T", Payload: []byte("refused")}
	require.NoError(t, c.Emit(ctx, refused))
	require.NoError(t, c.Emit(ctx, &ferry.Event{Topic: "orders", Key: "K", Type: "T", Payload: []byte("after")}))
	require.Eventually(t, func() bool {
		return len(payloadsOf(sinkA, "K")) == 1 && len(payloadsOf(sinkB, "K")) == 2
	}, 30*time.Second, 10*time.Millisecond)
	dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "a/0", dls[0].Feed)

	refusing.Store(false)
	n, err := drv.RedriveDeadLetters(ctx, driverkit.Refs(dls))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Eventually(t, func() bool { return len(payloadsOf(sinkA, "K")) == 2 }, 30*time.Second, 10*time.Millisecond,
		"feed a publishes the redriven event")
	// A later event of the key: once b has it, b would have had a copy of
	// the redriven one before it (same key, committed before).
	require.NoError(t, c.Emit(ctx, &ferry.Event{Topic: "orders", Key: "K", Type: "T", Payload: []byte("marker")}))
	require.Eventually(t, func() bool {
		return len(payloadsOf(sinkA, "K")) == 3 && len(payloadsOf(sinkB, "K")) == 3
	}, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"refused", "after", "marker"}, payloadsOf(sinkB, "K"), "feed b's destination got nothing new")
	require.Equal(t, []string{"after", "refused", "marker"}, payloadsOf(sinkA, "K"), "feed a's got the redriven event, before what came after")
	for _, e := range sinkA.Stored() {
		if string(e.Payload) == "refused" {
			require.Equal(t, refused.ID, e.ID, "its ID")
			require.EqualValues(t, 1, e.Seq, "its Seq")
		}
	}
	dls, err = drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Empty(t, dls)
}

// TestRedriveWaitsBehindTheKeysEventsInFlight: a key whose event is in
// flight when its redriven dead letter is found keeps its order: the
// event in flight, then the redriven one, then the key's later events.
func TestRedriveWaitsBehindTheKeysEventsInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	var refusing atomic.Bool
	refusing.Store(true)
	release, sent := make(chan struct{}), make(chan struct{}, 1)
	sink := &memsink.Sink{
		Permanent: func(e *ferryevent.Event) bool { return refusing.Load() && string(e.Payload) == "refused" },
		OnPublish: func(_ context.Context, events []*ferryevent.Event) {
			for _, e := range events {
				if string(e.Payload) == "slow" {
					select {
					case sent <- struct{}{}:
					default:
					}
				}
			}
		},
		Stall: func(e *ferryevent.Event) bool {
			select {
			case <-release:
				return false
			default:
				return string(e.Payload) == "slow"
			}
		},
		StallWait: func(ctx context.Context) {
			select {
			case <-release:
			case <-ctx.Done():
			}
		},
	}
	run(t, feedRelay(t, drv, sink, "a"))
	require.NoError(t, c.Emit(ctx, &ferry.Event{Topic: "orders", Key: "K", Type: "T", Payload: []byte("refused")}))
	var dls []*ferrydriver.DeadLetter
	require.Eventually(t, func() bool {
		dls, err = drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: "a"})
		return err == nil && len(dls) == 1
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, c.Emit(ctx, &ferry.Event{Topic: "orders", Key: "K", Type: "T", Payload: []byte("slow")}))
	<-sent // in flight, unanswered

	refusing.Store(false)
	n, err := drv.RedriveDeadLetters(ctx, driverkit.Refs(dls))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Eventually(t, func() bool {
		heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "a/0"})
		return err == nil && len(heads) == 1 && heads[0].Queued == 2 && string(heads[0].Event.Payload) == "refused"
	}, 30*time.Second, 10*time.Millisecond, "the relay took the key up: the event in flight went behind the redriven one in its queue")
	require.NoError(t, c.Emit(ctx, &ferry.Event{Topic: "orders", Key: "K", Type: "T", Payload: []byte("next")}))
	close(release)
	require.Eventually(t, func() bool { return len(payloadsOf(sink, "K")) == 3 }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"slow", "refused", "next"}, payloadsOf(sink, "K"))
	require.Eventually(t, func() bool {
		heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "a/0"})
		return err == nil && len(heads) == 0
	}, 30*time.Second, 10*time.Millisecond, "nothing left parked")
}
