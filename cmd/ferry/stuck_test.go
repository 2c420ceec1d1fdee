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

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
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

func (a *arrivals) record(ev ferry.Event) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := ev.ID.String()
	if _, ok := a.first[id]; ok {
		return
	}
	a.first[id] = time.Now()
	a.seqs[ev.Key] = append(a.seqs[ev.Key], ev.Seq)
}

func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.first)
}

// emitted is what pacedEmit wrote: each event with its commit time.
type emitted struct {
	events    []*ferry.Event
	committed map[string]time.Time
}

// pacedEmit emits one event per transaction at rate per second for d,
// round-robin over keys, on topics[i % len(topics)] for key i.
func pacedEmit(ctx context.Context, t *testing.T, f *fixture, keys, topics []string, rate int, d time.Duration) *emitted {
	t.Helper()
	out := &emitted{committed: map[string]time.Time{}}
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		if due := start.Add(time.Duration(i) * time.Second / time.Duration(rate)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
		k := i % len(keys)
		ev := &ferry.Event{Topic: topics[k%len(topics)], Key: keys[k], Type: "T", Payload: []byte(strconv.Itoa(i))}
		require.NoError(t, f.client.Emit(ctx, ev))
		out.committed[ev.ID.String()] = time.Now()
		out.events = append(out.events, ev)
	}
	return out
}

// othersLatency returns the commit→arrival p99 and maximum of the events of
// keys other than stuck, and how many of them arrived.
func othersLatency(e *emitted, a *arrivals, stuck string) (p99, worst time.Duration, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var lat []time.Duration
	for _, ev := range e.events {
		if ev.Key == stuck {
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
func requireOthersPrompt(t *testing.T, e *emitted, a *arrivals, stuck string) {
	t.Helper()
	others := 0
	for _, ev := range e.events {
		if ev.Key != stuck {
			others++
		}
	}
	require.Eventually(t, func() bool { _, _, n := othersLatency(e, a, stuck); return n == others }, 30*time.Second, 20*time.Millisecond,
		"the other keys' events arrive while %q is stuck", stuck)
	p99, worst, n := othersLatency(e, a, stuck)
	t.Logf("other keys while %q was stuck: %d events, commit→arrival p99 %v, max %v", stuck, n, p99.Round(time.Microsecond), worst.Round(time.Microsecond))
	require.Less(t, p99, time.Second)
}

// requireAllInOrder waits for every event and checks each key's first
// copies arrived in Seq order.
func requireAllInOrder(t *testing.T, e *emitted, a *arrivals, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return a.count() == len(e.events) }, within, 20*time.Millisecond, "every event arrives")
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
	e := pacedEmit(ctx, t, f, stuckKeys(), []string{"orders"}, 200, 6*time.Second)
	requireOthersPrompt(t, e, a, "stuck")

	pk := f.store.(ferrydriver.Parker)
	require.Eventually(t, func() bool {
		heads, err := pk.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "default/0"})
		return err == nil && len(heads) == 1 && heads[0].Held
	}, 30*time.Second, 50*time.Millisecond, "the stuck key is held after --max-age")
	st := ferryJSON(t, f, "status", "--json")
	require.EqualValues(t, 1, st["held_keys"], "ferry status shows the held key: %v", st)
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
	e := pacedEmit(context.Background(), t, f, stuckKeys(), []string{"orders"}, 50, failFor)
	requireOthersPrompt(t, e, a, "stuck")
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
