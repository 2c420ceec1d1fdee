package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// TestNATSRelaysHaveTheirOwnFencedConnections: ferry run gives each
// partition's relay its own NATS connection. A write refused on one (its
// partition handed over while its message waited in nats.go's buffer)
// closes that connection; the other partition's events, in flight on
// theirs, are not failed with it.
func TestNATSRelaysHaveTheirOwnFencedConnections(t *testing.T) {
	t.Parallel()
	testNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("FENCE%08x", rand.Uint32())
	dc := &daemonConfig{natsURL: natsURL(), stream: name, prefix: name, createStream: true}
	ns, err := openNATS(ctx, dc, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	defer ns.close()
	require.NotNil(t, ns.another, "each relay can have a sink of its own")
	p0 := ns.sink
	p1, err := ns.another(ctx)
	require.NoError(t, err)

	event := func(key string) []*ferryevent.Event {
		ev := &ferryevent.Event{Topic: "orders", Key: key, Type: "T", Payload: []byte(key)}
		require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
		return []*ferryevent.Event{ev}
	}
	holds := ferrysink.WithFence(ctx, func() error { return nil })
	// A first publish on each sets up nats.go's acknowledgement
	// subscription, so that the next writes carry the messages.
	require.NoError(t, p0.Publish(holds, event("warm0"))[0])
	require.NoError(t, p1.Publish(holds, event("warm1"))[0])

	// Partition 1 publishes all along, under a fence that holds.
	var p1Failed atomic.Value
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; !stop.Load(); i++ {
			evs := make([]*ferryevent.Event, 0, 20)
			for j := range 20 {
				evs = append(evs, event(fmt.Sprintf("p1-%d-%d", i, j))...)
			}
			for _, err := range p1.Publish(holds, evs) {
				if err != nil {
					p1Failed.CompareAndSwap(nil, err)
				}
			}
		}
	}()
	// Partition 0 hands over three times with a message in the buffer:
	// each time its write is refused.
	for range 3 {
		var checks atomic.Int32
		fence := func() error {
			if checks.Add(1) > 1 {
				return errors.New("lease lost")
			}
			return nil
		}
		errs := p0.Publish(ferrysink.WithFence(ctx, fence), event("p0"))
		require.Error(t, errs[0], "partition 0's write is refused")
		require.Eventually(t, func() bool {
			return p0.Publish(holds, event("p0-back"))[0] == nil
		}, 10*time.Second, 20*time.Millisecond, "partition 0's connection comes back")
	}
	stop.Store(true)
	<-done
	if err, _ := p1Failed.Load().(error); err != nil {
		t.Fatalf("partition 1's events failed with partition 0's handover: %v", err)
	}
}
