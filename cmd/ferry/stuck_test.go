package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The stuck-key tests run `ferry relay` against a destination that refuses
// or hangs for one key (or one subject, one partition) and check that every
// other key's events keep arriving within a second of their commit, and that
// the stuck key's events arrive afterwards, in order, with nothing lost.

// arrivals records the first copy of every event a destination received.
type arrivals struct {
	mu    sync.Mutex
	first map[string]time.Time // event ID → first arrival
	seqs  map[string][]int64   // key → Seq of first copies, in arrival order
}

func newArrivals() *arrivals {
	return &arrivals{first: map[string]time.Time{}, seqs: map[string][]int64{}}
}

func (a *arrivals) record(ev ferry.Event) { a.recordAt(ev, time.Now()) }

// recordAt records ev as stored at t (the destination's own timestamp).
func (a *arrivals) recordAt(ev ferry.Event, t time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := ev.ID.String()
	if _, ok := a.first[id]; ok {
		return
	}
	a.first[id] = t
	a.seqs[ev.Key] = append(a.seqs[ev.Key], ev.Seq)
}

func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.first)
}

// missing counts, per key, the events of e that have not arrived.
func (a *arrivals) missing(e *emitted) map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]int{}
	for _, ev := range e.events {
		if _, ok := a.first[ev.ID.String()]; !ok {
			out[ev.Key]++
		}
	}
	return out
}

// emitted is what pacedEmit wrote: each event with its commit time.
type emitted struct {
	events    []*ferry.Event
	committed map[string]time.Time
}

// pacedEmit emits one event per transaction at rate per second for d,
// round-robin over keys, on topic "orders" or, for a key, topicOf's.
func pacedEmit(ctx context.Context, t *testing.T, f *fixture, keys []string, topicOf func(key string) string, rate int, d time.Duration) *emitted {
	t.Helper()
	out := &emitted{committed: map[string]time.Time{}}
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		if due := start.Add(time.Duration(i) * time.Second / time.Duration(rate)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
		key := keys[i%len(keys)]
		topic := "orders"
		if topicOf != nil {
			topic = topicOf(key)
		}
		ev := &ferry.Event{Topic: topic, Key: key, Type: "T", Payload: []byte(strconv.Itoa(i))}
		require.NoError(t, f.client.Emit(ctx, ev))
		out.committed[ev.ID.String()] = time.Now()
		out.events = append(out.events, ev)
	}
	return out
}

// othersLatency returns the commit→arrival p99 and maximum of the events of
// keys other than stuck, and how many of them arrived.
func othersLatency(e *emitted, a *arrivals, stuck func(key string) bool) (p99, worst time.Duration, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var lat []time.Duration
	for _, ev := range e.events {
		if stuck(ev.Key) {
			continue
		}
		if at, ok := a.first[ev.ID.String()]; ok {
			lat = append(lat, at.Sub(e.committed[ev.ID.String()]))
		}
	}
	if len(lat) == 0 {
		return 0, 0, 0
	}
	slices.Sort(lat)
	return lat[len(lat)*99/100], lat[len(lat)-1], len(lat)
}

// requireOthersPrompt waits until every other key's event arrived and checks
// their p99 commit→arrival is under a second.
func requireOthersPrompt(t *testing.T, e *emitted, a *arrivals, stuck func(key string) bool) {
	t.Helper()
	others := 0
	for _, ev := range e.events {
		if !stuck(ev.Key) {
			others++
		}
	}
	require.Eventually(t, func() bool { _, _, n := othersLatency(e, a, stuck); return n == others }, 30*time.Second, 20*time.Millisecond,
		"the other keys' events arrive while some are stuck")
	p99, worst, n := othersLatency(e, a, stuck)
	t.Logf("other keys while some were stuck: %d events, commit→arrival p99 %v, max %v", n, p99.Round(time.Microsecond), worst.Round(time.Microsecond))
	require.Less(t, p99, time.Second)
}

func isStuck(key string) bool { return key == "stuck" }

// requireAllInOrder waits for every event and checks each key's first
// copies arrived in Seq order.
func requireAllInOrder(t *testing.T, e *emitted, a *arrivals, within time.Duration) {
	t.Helper()
	if !assert.Eventually(t, func() bool { return a.count() == len(e.events) }, within, 20*time.Millisecond, "every event arrives") {
		t.Fatalf("missing after %v, by key: %v", within, a.missing(e))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for key, seqs := range a.seqs {
		require.True(t, slices.IsSorted(seqs), "key %s: first copies out of order: %v", key, seqs)
	}
}

// webhookReceiver answers like fail says for each decoded event (0: 204).
func webhookReceiver(t *testing.T, a *arrivals, fail func(r *http.Request, ev ferry.Event) int) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, err := ferrywebhook.DecodeRequest(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if code := fail(r, ev); code != 0 {
			w.WriteHeader(code)
			return
		}
		a.record(ev)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func stuckKeys() []string {
	keys := []string{"stuck"}
	for i := range 9 {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	return keys
}

// TestWebhookKeyThatHangsIsHeldAndReleased: the receiver never answers for
// one key. The other keys flow; the stuck key is parked, then held after
// --max-age; once the receiver answers again, `ferry parked release`
// lets its events go, in order.
func TestWebhookKeyThatHangsIsHeldAndReleased(t *testing.T) {
	t.Parallel()
	a := newArrivals()
	var answer atomic.Bool
	answering := make(chan struct{})
	srv := webhookReceiver(t, a, func(r *http.Request, ev ferry.Event) int {
		if ev.Key != "stuck" || answer.Load() {
			return 0
		}
		select {
		case <-answering:
			return 0
		case <-r.Context().Done():
			return http.StatusServiceUnavailable
		}
	})
	f := newFixture(t)
	f.env = []string{"FERRY_WEBHOOK_UNSIGNED=true", "FERRY_WEBHOOK_TIMEOUT=1s"}
	f.sinkArgs = []string{"--sink-url", srv.URL + "/hooks"}
	relay := f.startRelay("hang", "--stall-timeout", "500ms", "--max-age", "3s")
	relay.awaitLeader(t, 30*time.Second)
	ctx := context.Background()
	e := pacedEmit(ctx, t, f, stuckKeys(), nil, 200, 6*time.Second)
	requireOthersPrompt(t, e, a, isStuck)

	require.Eventually(t, func() bool {
		heads, err := f.store.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "default/0"})
		return err == nil && len(heads) == 1 && heads[0].Held
	}, 30*time.Second, 50*time.Millisecond, "the stuck key is held after --max-age")
	st := ferryJSON(t, f, "status", "--json")
	require.EqualValues(t, 1, st["feeds"].([]any)[0].(map[string]any)["held_keys"], "ferry status shows the held key: %v", st)
	a.mu.Lock()
	require.Empty(t, a.seqs["stuck"], "nothing of the stuck key arrived")
	a.mu.Unlock()

	answer.Store(true) // the receiver answers again
	close(answering)
	out, err := exec.Command(ferryBin, append([]string{"parked", "release", "stuck"}, f.dbArgs...)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "released")
	requireAllInOrder(t, e, a, 30*time.Second)
	relay.stop(t)
}

// ferryJSON runs a ferry command on the fixture's database and decodes its
// JSON output.
func ferryJSON(t *testing.T, f *fixture, args ...string) map[string]any {
	t.Helper()
	out, err := exec.Command(ferryBin, append(args, f.dbArgs...)...).Output()
	require.NoError(t, err, "%s", out)
	var v map[string]any
	require.NoError(t, json.Unmarshal(out, &v), "%s", out)
	return v
}

// TestWebhookKeyFailingForAMinuteRecovers: the receiver answers 503 for one
// key for 60 s, then recovers. The other keys flow throughout; the stuck
// key's events arrive, in order, once it recovers.
func TestWebhookKeyFailingForAMinuteRecovers(t *testing.T) {
	t.Parallel()
	a := newArrivals()
	failFor := 60 * time.Second
	if testing.Short() {
		failFor = 10 * time.Second
	}
	var start time.Time
	var once sync.Once
	srv := webhookReceiver(t, a, func(_ *http.Request, ev ferry.Event) int {
		once.Do(func() { start = time.Now() })
		if ev.Key == "stuck" && time.Since(start) < failFor {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	f := newFixture(t)
	f.env = []string{"FERRY_WEBHOOK_UNSIGNED=true"}
	f.sinkArgs = []string{"--sink-url", srv.URL + "/hooks"}
	relay := f.startRelay("fail", "--stall-timeout", "500ms")
	relay.awaitLeader(t, 30*time.Second)
	e := pacedEmit(context.Background(), t, f, stuckKeys(), nil, 50, failFor)
	requireOthersPrompt(t, e, a, isStuck)
	requireAllInOrder(t, e, a, 60*time.Second)
	parked := false
	for _, l := range relay.logs.all() {
		if strings.Contains(l, "key parked") && strings.Contains(l, `"key":"stuck"`) {
			parked = true
		}
	}
	require.True(t, parked, "the failing key was parked")
	relay.stop(t)
}

// TestJetStreamSubjectAtItsLimitCostsOnlyItsKeys: the stream refuses one
// subject (filled to its per-subject limit beforehand, discard new); the
// other subjects' events keep being stored; once the limit is raised the
// refused ones are stored, in order.
func TestJetStreamSubjectAtItsLimitCostsOnlyItsKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: f.stream, Subjects: []string{f.prefix + ".>"}, Duplicates: 2 * time.Minute,
		MaxMsgsPerSubject: 150, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true,
	})
	require.NoError(t, err)
	for i := range 150 {
		_, err := f.js.PublishMsg(ctx, &nats.Msg{Subject: f.prefix + ".full", Header: nats.Header{"Prefill": []string{strconv.Itoa(i)}}})
		require.NoError(t, err)
	}
	a := newArrivals()
	s, err := f.js.Stream(ctx, f.stream)
	require.NoError(t, err)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		if msg.Headers().Get("Prefill") != "" {
			return
		}
		ev, err := ferrynats.DecodeJetStream(msg)
		if err != nil {
			t.Error(err)
			return
		}
		md, err := msg.Metadata()
		if err != nil {
			t.Error(err)
			return
		}
		a.recordAt(ev, md.Timestamp)
	})
	require.NoError(t, err)
	defer cc.Stop()

	relay := f.startRelay("full", "--stall-timeout", "500ms")
	relay.awaitLeader(t, 30*time.Second)
	topicOf := func(key string) string {
		if key == "stuck" {
			return "full"
		}
		return "orders-" + key // a subject each, under the limit
	}
	e := pacedEmit(ctx, t, f, stuckKeys(), topicOf, 200, 5*time.Second)
	defer func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", strings.Join(relay.logs.all(), "\n"))
		}
	}()
	requireOthersPrompt(t, e, a, isStuck)
	a.mu.Lock()
	require.Empty(t, a.seqs["stuck"], "the full subject took nothing")
	a.mu.Unlock()

	info, err := s.Info(ctx)
	require.NoError(t, err)
	cfg := info.Config
	cfg.MaxMsgsPerSubject = 1000
	_, err = f.js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	requireAllInOrder(t, e, a, 60*time.Second)
	relay.stop(t)
}

// TestKafkaPartitionRefusingCostsOnlyItsKeys: kfake refuses every produce
// to one partition (NOT_ENOUGH_REPLICAS); keys on the other partitions keep
// flowing; once it accepts again, the refused keys' records are stored, in
// order.
func TestKafkaPartitionRefusingCostsOnlyItsKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(4, "orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	// The refused partition is the one key "stuck" maps to, alone on its
	// broker; every produce request that broker gets is refused.
	bad := ferrykafka.Partition([]byte("stuck"), 4)
	node := c.LeaderFor("orders", bad)
	for p := range int32(4) {
		if p != bad && c.LeaderFor("orders", p) == node {
			require.NoError(t, c.MoveTopicPartition("orders", p, (node+1)%3))
		}
	}
	var refusing atomic.Bool
	refusing.Store(true)
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !refusing.Load() || c.CurrentNode() != node {
			return nil, nil, false
		}
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	brokers := c.ListenAddrs()
	f.sinkArgs = []string{"--sink-url", "kafka://" + strings.Join(brokers, ",") + "/"}

	a := newArrivals()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var consumed sync.WaitGroup
	consumed.Go(func() {
		for ctx.Err() == nil {
			fetches := cl.PollFetches(ctx)
			for _, r := range fetches.Records() {
				ev, err := ferrykafka.Decode(r)
				if err != nil {
					t.Error(err)
					return
				}
				a.record(ev)
			}
		}
	})
	defer func() { cancel(); consumed.Wait(); cl.Close() }()

	relay := f.startRelay("refused", "--stall-timeout", "500ms")
	relay.awaitLeader(t, 30*time.Second)
	keys := stuckKeys()
	onBad := func(key string) bool { return ferrykafka.Partition([]byte(key), 4) == bad }
	e := pacedEmit(ctx, t, f, keys, nil, 200, 5*time.Second)
	requireOthersPrompt(t, e, a, onBad)
	a.mu.Lock()
	for _, k := range keys {
		if onBad(k) {
			require.Empty(t, a.seqs[k], "nothing of key %s (refused partition %d) was stored", k, bad)
		}
	}
	a.mu.Unlock()
	refusing.Store(false)
	requireAllInOrder(t, e, a, 90*time.Second)
	relay.stop(t)
}
