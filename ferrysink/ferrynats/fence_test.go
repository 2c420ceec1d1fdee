package ferrynats_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
)

// fenceEndingAfterHandOff passes the sink's own check, made right before
// it hands the message to nats.go, and fails every later one: the lease
// ends while the message waits in nats.go's buffer, as when the leader is
// paused there.
func fenceEndingAfterHandOff() (fence func() error, checks *atomic.Int32) {
	checks = new(atomic.Int32)
	return func() error {
		if checks.Add(1) > 1 {
			return errors.New("lease lost")
		}
		return nil
	}, checks
}

func fencedConn(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	testConn(t) // skips, or fails under CI=true, without a server
	url := os.Getenv(urlVar)
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := nats.Connect(url, append(opts, nats.Name("ferrynats write-fence test"), nats.ReconnectWait(50*time.Millisecond))...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func streamMsgs(ctx context.Context, t *testing.T, stream string) uint64 {
	t.Helper()
	s, err := testJetStream(t).Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return info.State.Msgs
}

func TestWriteFenceDropsWhatWaitsInTheBuffer(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	nc := fencedConn(t, ferrynats.WriteFence())
	stream, prefix := testNames(t)
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, sink.Close(context.Background())) }()

	// A first publish sets up the client's acknowledgement subscription
	// (nats.go does it on the first asynchronous publish), so that the
	// next write carries the message itself.
	holds := ferrysink.WithFence(ctx, func() error { return nil })
	require.NoError(t, sink.Publish(holds, []*ferryevent.Event{event("orders", "k0")})[0])

	fence, checks := fenceEndingAfterHandOff()
	start := time.Now()
	errs := sink.Publish(ferrysink.WithFence(ctx, fence), []*ferryevent.Event{event("orders", "k1")})
	require.Error(t, errs[0])
	require.Contains(t, errs[0].Error(), "lease fence had ended", "the write carrying the message was refused")
	require.False(t, ferrysink.IsPermanent(errs[0]), "the relay retries it (under a fence that holds)")
	require.GreaterOrEqual(t, checks.Load(), int32(2), "the write checked the fence")
	require.Less(t, time.Since(start), ferrynats.DefaultAckTimeout, "reported at once, not after the ack timeout")

	// The connection comes back, and a publish whose fence holds goes through.
	require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond)
	var good []error
	require.Eventually(t, func() bool {
		good = sink.Publish(ferrysink.WithFence(ctx, func() error { return nil }), []*ferryevent.Event{event("orders", "k2")})
		return good[0] == nil
	}, 10*time.Second, 50*time.Millisecond, "publish after the reconnection: %v", good)
	require.Equal(t, uint64(2), streamMsgs(ctx, t, stream), "the first and the last event are stored, not the fenced one")
}

// TestWithoutWriteFenceTheBufferIsWritten is the same without WriteFence:
// the message the sink handed over before the fence ended is stored. It
// shows what the option is for, and that the test above can fail.
func TestWithoutWriteFenceTheBufferIsWritten(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	nc := fencedConn(t)
	stream, prefix := testNames(t)
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, sink.Close(context.Background())) }()

	require.NoError(t, sink.Publish(ctx, []*ferryevent.Event{event("orders", "k0")})[0])
	fence, checks := fenceEndingAfterHandOff()
	errs := sink.Publish(ferrysink.WithFence(ctx, fence), []*ferryevent.Event{event("orders", "k1")})
	require.NoError(t, errs[0])
	require.Equal(t, int32(1), checks.Load())
	require.Equal(t, uint64(2), streamMsgs(ctx, t, stream))
}

// TestWriteFenceKeepsOtherCallsWhole publishes many events under fences
// that hold, from several goroutines, on a fenced connection: nothing is
// refused, everything is stored once.
func TestWriteFenceKeepsOtherCallsWhole(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	nc := fencedConn(t, ferrynats.WriteFence())
	stream, prefix := testNames(t)
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, sink.Close(context.Background())) }()

	const callers, perCall, calls = 4, 50, 10
	errc := make(chan error, callers)
	for c := range callers {
		go func() {
			fctx := ferrysink.WithFence(ctx, func() error { return nil })
			for range calls {
				evs := make([]*ferryevent.Event, perCall)
				for i := range evs {
					evs[i] = event("orders", string(rune('a'+c)))
				}
				for _, err := range sink.Publish(fctx, evs) {
					if err != nil {
						errc <- err
						return
					}
				}
			}
			errc <- nil
		}()
	}
	for range callers {
		require.NoError(t, <-errc)
	}
	require.Equal(t, uint64(callers*perCall*calls), streamMsgs(ctx, t, stream))
}
