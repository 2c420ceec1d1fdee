package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
)

// TestRelayCrashKafka is TestRelayCrash publishing to Kafka (kfake, an
// in-process cluster speaking the real protocol, in the test process; the
// relay child connects to it): Kafka keeps every republished copy, so the
// test checks each key's first copies and bounds the copies.
func TestRelayCrashKafka(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.useKafka()
	relayCrash(t, f)
}

// useKafka makes a fresh kfake cluster, topic "orders" over 4 partitions,
// the relay's destination.
func (f *fixture) useKafka() {
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(4, "orders"))
	require.NoError(f.t, err)
	f.t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	f.sinkArgs = []string{"--sink-url", "kafka://" + strings.Join(brokers, ",") + "/"}
	f.dedup = false
	f.count = func(ctx context.Context) int64 {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		require.NoError(f.t, err)
		defer cl.Close()
		var n int64
		for _, end := range listEnds(ctx, f.t, cl) {
			n += end
		}
		return n
	}
	f.read = func(ctx context.Context) []ferry.Event {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		require.NoError(f.t, err)
		defer cl.Close()
		ends := map[int32]int64{}
		for p, o := range listEnds(ctx, f.t, cl) {
			ends[p] = o
		}
		next := map[int32]int64{}
		var out []ferry.Event
		for {
			done := true
			for p, end := range ends {
				if next[p] < end {
					done = false
				}
			}
			if done {
				return out
			}
			fetches := cl.PollFetches(ctx)
			require.NoError(f.t, ctx.Err())
			for _, r := range fetches.Records() {
				ev, err := ferrykafka.Decode(r)
				require.NoError(f.t, err)
				out = append(out, ev)
				next[r.Partition] = r.Offset + 1
			}
		}
	}
}

// listEnds returns the end offset of each partition of "orders".
func listEnds(ctx context.Context, t *testing.T, cl *kgo.Client) map[int32]int64 {
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "orders")
	require.NoError(t, err)
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}
