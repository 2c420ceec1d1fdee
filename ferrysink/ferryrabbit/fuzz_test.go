package ferryrabbit_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryevent/ferryeventtest"
	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
)

// FuzzWire: every event Emit accepts, published by the sink to RabbitMQ
// and decoded from the message a basic.get returns, comes back exactly.
// Run longer with go test -run '^$' -fuzz FuzzWire -fuzztime 60s.
func FuzzWire(f *testing.F) {
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)
	top := newTopology(f, nil, "#")
	sink, err := ferryrabbit.New(ctx, &ferryrabbit.Config{URL: testURL(f), Exchange: top.exchange, Logger: quiet})
	require.NoError(f, err)
	f.Cleanup(func() { require.NoError(f, sink.Close(context.Background())) })
	ch, err := adminConn(f).Channel()
	require.NoError(f, err)
	f.Cleanup(func() { _ = ch.Close() })

	ferryeventtest.Fuzz(f, func(t *testing.T, ev *ferryevent.Event) *ferryevent.Event {
		for _, err := range sink.Publish(ctx, []*ferryevent.Event{ev}) {
			require.NoError(t, err, "an event Emit accepts must be published")
		}
		// Publish returns once the broker confirmed, so the message is
		// in the queue.
		d, ok, err := ch.Get(top.queue, true)
		require.NoError(t, err)
		require.True(t, ok, "the confirmed message is not in the queue")
		got, err := ferryrabbit.Decode(d)
		require.NoError(t, err)
		return &got
	})
}
