package ferrywebhook_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryevent/ferryeventtest"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// FuzzWire: every event Emit accepts, sent by the sink as a signed HTTP
// request and decoded by Handler on the receiving server (net/http's
// header handling on both ends included), comes back exactly. Run longer
// with go test -run '^$' -fuzz FuzzWire -fuzztime 60s.
func FuzzWire(f *testing.F) {
	rc := newReceiver(f, []string{secret}, nil)
	sink := newTestSink(f, ferrywebhook.Config{URL: rc.srv.URL})
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)

	ferryeventtest.Fuzz(f, func(t *testing.T, ev *ferryevent.Event) *ferryevent.Event {
		for _, err := range sink.Publish(ctx, []*ferryevent.Event{ev}) {
			require.NoError(t, err, "an event Emit accepts must be delivered")
		}
		received := rc.events()
		require.NotEmpty(t, received)
		return &received[len(received)-1]
	})
}
