package ferrynats_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryevent/ferryeventtest"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
)

// FuzzWire: every event Emit accepts, published by the sink into a
// JetStream stream (nats.go's header encoding and the server included) and
// decoded from what the stream stored, comes back exactly. Run longer with
// go test -run '^$' -fuzz FuzzWire -fuzztime 60s.
func FuzzWire(f *testing.F) {
	ctx := testContext(f)
	stream, prefix := testNames(f)
	sink, err := ferrynats.New(ctx, testConn(f), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	require.NoError(f, err)
	f.Cleanup(func() { require.NoError(f, sink.Close(context.Background())) })
	s, err := testJetStream(f).Stream(ctx, stream)
	require.NoError(f, err)

	ferryeventtest.Fuzz(f, func(t *testing.T, ev *ferryevent.Event) *ferryevent.Event {
		for _, err := range sink.Publish(ctx, []*ferryevent.Event{ev}) {
			require.NoError(t, err, "an event Emit accepts must be published")
		}
		raw, err := s.GetLastMsgForSubject(ctx, prefix+"."+ev.Topic)
		require.NoError(t, err)
		got, err := ferrynats.Decode(&nats.Msg{Header: raw.Header, Data: raw.Data})
		require.NoError(t, err)
		return &got
	})
}
