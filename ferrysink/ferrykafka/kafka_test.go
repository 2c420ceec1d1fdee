package ferrykafka_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
	"github.com/ferry-dev/ferry/ferrysink/ferrysinktest"
)

// The tests run on kfake, an in-process Kafka cluster that speaks the real
// protocol: no broker runs on the project's machines.

// suiteTopics are the Kafka topics the tests create; the conformance
// harness maps every event topic to "events" (but the unroutable one).
var suiteTopics = []string{"orders", "events"}

const unroutable = "no-such-topic"

// suiteTopic is the conformance harness's topic mapping.
func suiteTopic(ev *ferryevent.Event) string {
	if ev.Topic == unroutable {
		return unroutable
	}
	return "events"
}

const partitions = 4

// benchCluster is cluster for benchmarks.
func benchCluster(b *testing.B) []string {
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(partitions, suiteTopics...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c.ListenAddrs()
}

// cluster starts a three-broker kfake cluster with the suite's topics.
func cluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(3), kfake.SeedTopics(partitions, suiteTopics...)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newSink(t *testing.T, brokers []string, cfg *ferrykafka.Config) *ferrykafka.Sink {
	t.Helper()
	c := ferrykafka.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Brokers = brokers
	sink, err := ferrykafka.New(testContext(t), &c)
	require.NoError(t, err)
	return sink
}

// readAll reads every record of the topics from the start, decoded, in
// offset order per partition.
func readAll(ctx context.Context, brokers []string, topics ...string) ([]ferrysinktest.Stored, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := endOffsets(ctx, cl, topics)
	if err != nil {
		return nil, err
	}
	var out []ferrysinktest.Stored
	next := map[string]int64{}
	for !reached(next, ends) {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return nil, ferr
		}
		for _, r := range fetches.Records() {
			ev, err := ferrykafka.Decode(r)
			if err != nil {
				return nil, err
			}
			out = append(out, ferrysinktest.Stored{Event: ev})
			next[r.Topic+"/"+strconv.Itoa(int(r.Partition))] = r.Offset + 1
		}
	}
	return out, nil
}

func endOffsets(ctx context.Context, cl *kgo.Client, topics []string) (map[string]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	for _, topic := range topics {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for p := range int32(partitions) {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.Timestamp = p, -1 // latest
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	shards := cl.RequestSharded(ctx, req)
	ends := map[string]int64{}
	for _, sh := range shards {
		if sh.Err != nil {
			return nil, sh.Err
		}
		for _, rt := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					return nil, err
				}
				if rp.Offset > 0 {
					ends[rt.Topic+"/"+strconv.Itoa(int(rp.Partition))] = rp.Offset
				}
			}
		}
	}
	return ends, nil
}

func reached(next, ends map[string]int64) bool {
	for k, end := range ends {
		if next[k] < end {
			return false
		}
	}
	return true
}

func TestConformance(t *testing.T) {
	t.Parallel()
	ferrysinktest.Exercise(t, ferrysinktest.Harness{
		Features: ferrysinktest.Features{
			MaxPayloadBytes: 256 << 10, // the sink's MaxMessageBytes: a payload over it is over the limit
			Persistent:      true,
			UnroutableTopic: unroutable,
		},
		New: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc) {
			brokers := cluster(t).ListenAddrs()
			sink := newSink(t, brokers, &ferrykafka.Config{MaxMessageBytes: 256 << 10, Topic: suiteTopic})
			return sink, func(ctx context.Context) ([]ferrysinktest.Stored, error) {
				return readAll(ctx, brokers, suiteTopics...)
			}
		},
		// The interruptions, in turn: the produce requests of the next
		// moments fail, some after the broker stored them (REQUEST_TIMED_OUT,
		// as when an acknowledgement is lost), some before
		// (NOT_ENOUGH_REPLICAS, NOT_LEADER_FOR_PARTITION), and the
		// partitions change leaders; or the whole cluster restarts on the
		// same ports from its data directory (what it acknowledged must
		// still be there: Features.Persistent).
		NewFaulty: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc, func()) {
			dir := t.TempDir()
			var mu sync.Mutex
			c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(partitions, suiteTopics...), kfake.DataDir(dir), kfake.SyncWrites())
			require.NoError(t, err)
			t.Cleanup(func() { mu.Lock(); c.Close(); mu.Unlock() })
			brokers := c.ListenAddrs()
			var ports []int
			for _, a := range brokers {
				_, p, err := net.SplitHostPort(a)
				require.NoError(t, err)
				n, err := strconv.Atoi(p)
				require.NoError(t, err)
				ports = append(ports, n)
			}
			sink := newSink(t, brokers, &ferrykafka.Config{Topic: suiteTopic})
			calls := 0
			interrupt := func() {
				mu.Lock()
				defer mu.Unlock()
				calls++
				if calls%2 == 0 {
					c.Close()
					restarted, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.Ports(ports...), kfake.DataDir(dir), kfake.SyncWrites())
					require.NoError(t, err, "restart the cluster")
					c = restarted
					t.Logf("interruption %d: the cluster restarted from %s", calls, dir)
					return
				}
				produce := []kmsg.Key{kmsg.Produce}
				h := c.Fault(
					kfake.Fault{Keys: produce, Err: kerr.RequestTimedOut, Count: 3},
					kfake.Fault{Keys: produce, Err: kerr.NotEnoughReplicas, Count: 3},
					kfake.Fault{Keys: produce, Err: kerr.NotLeaderForPartition, Count: 2},
				)
				c.ShufflePartitionLeaders()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = h.Wait(ctx, 1)
			}
			return sink, func(ctx context.Context) ([]ferrysinktest.Stored, error) {
				return readAll(ctx, brokers, suiteTopics...)
			}, interrupt
		},
	})
}

func TestSourceConformance(t *testing.T) {
	t.Parallel()
	ferrysinktest.ExerciseSource(t, ferrysinktest.SourceHarness{
		New: func(t *testing.T) (func(context.Context, []*ferryevent.Event) error, func(t *testing.T) ferrysink.Source) {
			brokers := cluster(t).ListenAddrs()
			sink := newSink(t, brokers, nil)
			t.Cleanup(func() { _ = sink.Close(context.Background()) })
			publish := func(ctx context.Context, events []*ferryevent.Event) error {
				return errors.Join(sink.Publish(ctx, events)...)
			}
			return publish, func(t *testing.T) ferrysink.Source {
				src, err := ferrykafka.NewSource(testContext(t), &ferrykafka.SourceConfig{Brokers: brokers, Group: "group", Topics: suiteTopics,
					RetryBase: 20 * time.Millisecond})
				require.NoError(t, err)
				return src
			}
		},
		System: "kafka",
	})
}

// TestPartitionIsJavaCompatible: records land on the partition Kafka's Java
// client picks for their key, murmur2(key) & 0x7fffffff % partitions, with
// the hash checked against Kafka's own test vectors.
func TestPartitionIsJavaCompatible(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]int32{
		"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
		"a-little-bit-longer-string": -1486304829, "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, "abc": 479470107,
	} {
		require.Equal(t, want, int32(ferrykafka.Murmur2([]byte(key))), "murmur2(%q)", key)
	}
	ctx := testContext(t)
	brokers := cluster(t).ListenAddrs()
	sink := newSink(t, brokers, nil)
	defer sink.Close(ctx)
	var events []*ferryevent.Event
	for i := range 200 {
		ev := &ferryevent.Event{Topic: "orders", Key: fmt.Sprintf("customer-%d", i), Type: "T"}
		require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
		events = append(events, ev)
	}
	require.NoError(t, errors.Join(sink.Publish(ctx, events)...))

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	seen := 0
	for seen < len(events) {
		fetches := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		for _, r := range fetches.Records() {
			require.Equal(t, ferrykafka.Partition(r.Key, partitions), r.Partition, "key %s", r.Key)
			seen++
		}
	}
}

// TestMissingTopicIsPermanent: a topic that does not exist is a permanent
// failure (dead-lettered with the reason), not an endless retry.
func TestMissingTopicIsPermanent(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink := newSink(t, cluster(t).ListenAddrs(), &ferrykafka.Config{TopicPrefix: "app."})
	defer sink.Close(ctx)
	ev := &ferryevent.Event{Topic: "orders", Key: "k", Type: "T"}
	require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
	errs := sink.Publish(ctx, []*ferryevent.Event{ev})
	require.True(t, ferrysink.IsPermanent(errs[0]), "got %v", errs[0])
	require.ErrorContains(t, errs[0], `"app.orders" does not exist`)
}

// TestPublishRefusesFerrysHeaderNames: Emit refuses header names Ferry
// writes itself; an event holding one all the same (an outbox row of an
// earlier version) fails permanently, naming it, instead of being sent
// without it. Other headers go through unchanged.
func TestPublishRefusesFerrysHeaderNames(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := cluster(t)
	sink := newSink(t, c.ListenAddrs(), nil)
	defer sink.Close(ctx)
	for _, name := range []string{"ce_id", "CE_ferrytopic", "ce_traceparent", "content-type", "Content-Type"} {
		ev := &ferryevent.Event{Topic: "orders", Key: "k", Type: "T"}
		require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
		ev.Headers = map[string]string{name: "x"} // past Emit's check
		err := sink.Publish(ctx, []*ferryevent.Event{ev})[0]
		require.True(t, ferrysink.IsPermanent(err), "%s: %v", name, err)
		require.ErrorContains(t, err, strconv.Quote(name))
	}
	ev := &ferryevent.Event{Topic: "orders", Key: "k", Type: "T", Headers: map[string]string{"x-ce_id": "y", "tenant": "acme"}}
	require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
	require.NoError(t, sink.Publish(ctx, []*ferryevent.Event{ev})[0])
	stored, err := readAll(ctx, c.ListenAddrs(), "orders")
	require.NoError(t, err)
	require.Len(t, stored, 1, "only the last event was stored")
	require.Equal(t, ev.Headers, stored[0].Event.Headers)
}

// TestLaterRecordsOfAKeyFailWithTheFirst: when the broker keeps refusing a
// partition's records past the delivery timeout, every record of that
// partition in the call fails: none is acknowledged after an earlier one
// of its key failed.
func TestLaterRecordsOfAKeyFailWithTheFirst(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := cluster(t)
	sink := newSink(t, c.ListenAddrs(), &ferrykafka.Config{DeliveryTimeout: time.Second})
	defer sink.Close(ctx)
	part := ferrykafka.Partition([]byte("hot"), partitions)
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Partitions: []int32{part}, Err: kerr.NotEnoughReplicas, Count: -1})
	var events []*ferryevent.Event
	for i := range 10 {
		key := "hot"
		if i%2 == 1 {
			key = "other-" + strconv.Itoa(i)
		}
		ev := &ferryevent.Event{Topic: "orders", Key: key, Type: "T"}
		require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
		events = append(events, ev)
	}
	errs := sink.Publish(ctx, events)
	h.Remove()
	for i, ev := range events {
		if ferrykafka.Partition([]byte(ev.Key), partitions) == part {
			require.Error(t, errs[i], "event %d of key %s", i, ev.Key)
			require.False(t, ferrysink.IsPermanent(errs[i]), "a refused partition is retried later, not dead-lettered")
		} else {
			require.NoError(t, errs[i], "event %d of key %s", i, ev.Key)
		}
	}
	// And the retry succeeds once the broker accepts again.
	var retry []*ferryevent.Event
	for i, err := range errs {
		if err != nil {
			retry = append(retry, events[i])
		}
	}
	require.NoError(t, errors.Join(sink.Publish(ctx, retry)...))
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	for _, tc := range []struct {
		cfg  ferrykafka.Config
		want string
	}{
		{ferrykafka.Config{}, "Brokers is empty"},
		{ferrykafka.Config{Brokers: []string{"kafka://x:9092"}}, "not host:port"},
		{ferrykafka.Config{Brokers: []string{"x:9092"}, MaxMessageBytes: 10}, "MaxMessageBytes"},
	} {
		_, err := ferrykafka.New(ctx, &tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := ferrykafka.NewSource(ctx, &ferrykafka.SourceConfig{Brokers: []string{"x:1"}, Topics: []string{"t"}})
	require.ErrorContains(t, err, "Group")
}

// TestFenceFailsBufferedRecords: records that franz-go still buffers when
// the relay's fence starts refusing (a paused leader resuming past its
// lease) fail instead of being sent; the request already in flight is
// answered as usual.
func TestFenceFailsBufferedRecords(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := cluster(t)
	// Hold the first produce request until released, so that the next
	// records of its partition wait in the client's buffer behind it.
	release := make(chan struct{})
	var held atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if held.CompareAndSwap(false, true) {
			c.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	sink := newSink(t, c.ListenAddrs(), nil)
	defer sink.Close(ctx)
	var fenced atomic.Bool
	errFenced := errors.New("lease lost")
	fctx := ferrysink.WithFence(ctx, func() error {
		if fenced.Load() {
			return errFenced
		}
		return nil
	})
	first := &ferryevent.Event{Topic: "orders", Key: "hot", Type: "T"}
	require.NoError(t, ferryevent.Prepare(first, 0, 0, time.Now()))
	firstErr := make(chan error, 1)
	go func() { firstErr <- sink.Publish(fctx, []*ferryevent.Event{first})[0] }()
	require.Eventually(t, held.Load, 10*time.Second, time.Millisecond, "the first request reached the broker")

	// Same key, so same partition: buffered behind the held request.
	var later []*ferryevent.Event
	for range 5 {
		ev := &ferryevent.Event{Topic: "orders", Key: "hot", Type: "T"}
		require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
		later = append(later, ev)
	}
	laterErrs := make(chan []error, 1)
	go func() { laterErrs <- sink.Publish(fctx, later) }()
	time.Sleep(200 * time.Millisecond) // let them reach the client's buffer
	fenced.Store(true)
	close(release)

	require.NoError(t, <-firstErr, "the request in flight is answered")
	for i, err := range <-laterErrs {
		require.ErrorIs(t, err, errFenced, "buffered record %d", i)
	}
	stored, err := readAll(ctx, c.ListenAddrs(), "orders")
	require.NoError(t, err)
	require.Len(t, stored, 1, "only the record sent before the fence refused is stored")
	require.Equal(t, first.ID, stored[0].Event.ID)
}
