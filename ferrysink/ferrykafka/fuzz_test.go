package ferrykafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryevent/ferryeventtest"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
)

// FuzzWire: every event Emit accepts, produced by the sink to a broker
// speaking the Kafka protocol (kfake) and decoded from the record a
// consumer fetches, comes back exactly. Run longer with
// go test -run '^$' -fuzz FuzzWire -fuzztime 60s.
func FuzzWire(f *testing.F) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "fuzz"))
	require.NoError(f, err)
	f.Cleanup(c.Close)
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)
	sink, err := ferrykafka.New(ctx, &ferrykafka.Config{
		Brokers: c.ListenAddrs(),
		Topic:   func(*ferryevent.Event) string { return "fuzz" },
	})
	require.NoError(f, err)
	f.Cleanup(func() { require.NoError(f, sink.Close(context.Background())) })
	consumer, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("fuzz"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(f, err)
	f.Cleanup(consumer.Close)
	var fetched []*kgo.Record // records fetched ahead of the one looked for

	ferryeventtest.Fuzz(f, func(t *testing.T, ev *ferryevent.Event) *ferryevent.Event {
		for _, err := range sink.Publish(ctx, []*ferryevent.Event{ev}) {
			require.NoError(t, err, "an event Emit accepts must be published")
		}
		wait, stop := context.WithTimeout(ctx, 30*time.Second)
		defer stop()
		for len(fetched) == 0 {
			fs := consumer.PollFetches(wait)
			require.NoError(t, wait.Err(), "the produced record was not fetched")
			require.Empty(t, fs.Errors())
			fetched = append(fetched, fs.Records()...)
		}
		rec := fetched[0]
		fetched = fetched[1:]
		got, err := ferrykafka.Decode(rec)
		require.NoError(t, err)
		return &got
	})
}
