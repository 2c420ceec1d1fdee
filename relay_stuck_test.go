package ferry_test

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stuckRelay is a relay with a short StallTimeout for the stuck-key tests.
func stuckRelay(t *testing.T, store ferrydriver.Store, sink *memsink.Sink, mod func(*ferry.RelayConfig)) *ferry.Relay {
	t.Helper()
	cfg := &ferry.RelayConfig{
		HolderID: "stuck", PollInterval: 20 * time.Millisecond, LeaseTTL: 5 * time.Second,
		RetryBase: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		StallTimeout: 300 * time.Millisecond,
	}
	if mod != nil {
		mod(cfg)
	}
	r, err := ferry.NewRelay(store, sink, cfg)
	require.NoError(t, err)
	return r
}

// paced emits n events round-robin over keys, one every gap, and returns
// them with their commit times.
func paced(t *testing.T, c *ferry.Client[pgx.Tx], keys []string, n int, gap time.Duration) ([]*ferry.Event, map[string]time.Time) {
	t.Helper()
	ctx := context.Background()
	var out []*ferry.Event
	committed := map[string]time.Time{}
	for i := range n {
		ev := &ferry.Event{Topic: "t", Key: keys[i%len(keys)], Type: "T", Payload: []byte(strconv.Itoa(i))}
		require.NoError(t, c.Emit(ctx, ev))
		committed[ev.ID.String()] = time.Now()
		out = append(out, ev)
		time.Sleep(gap)
	}
	return out, committed
}

// latencies returns commit→stored for the stored events of keys other than
// skip, sorted.
func latencies(sink *memsink.Sink, committed map[string]time.Time, skip string) []time.Duration {
	var out []time.Duration
	at := sink.StoredAt()
	for i, ev := range sink.Stored() {
		if ev.Key == skip {
			continue
		}
		if c, ok := committed[ev.ID.String()]; ok {
			out = append(out, at[i].Sub(c))
		}
	}
	slices.Sort(out)
	return out
}

// hangingStuckKey returns a sink that answers key "stuck" only once
// release is closed (or the call's context ends), the others at once.
func hangingStuckKey(release <-chan struct{}) *memsink.Sink {
	return &memsink.Sink{
		Stall: func(e *ferryevent.Event) bool {
			select {
			case <-release:
				return false
			default:
				return e.Key == "stuck"
			}
		},
		StallWait: func(ctx context.Context) {
			select {
			case <-release:
			case <-ctx.Done():
			}
		},
	}
}

// failingStuckKey returns a sink that fails key "stuck" transiently while
// the flag is set (it is, to begin with).
func failingStuckKey() (*memsink.Sink, *atomic.Bool) {
	failing := new(atomic.Bool)
	failing.Store(true)
	return &memsink.Sink{Fail: func(e *ferryevent.Event) bool { return e.Key == "stuck" && failing.Load() }}, failing
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[(len(d)*99)/100]
}

// keysFor returns "stuck" and n other keys.
func keysFor(n int) []string {
	keys := []string{"stuck"}
	for i := range n {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	return keys
}

// TestRelayKeyThatHangsCostsOnlyItself: the destination hangs for one key;
// every other key's events keep arriving promptly; once the destination
// answers again, the stuck key's events arrive, in order; nothing is lost.
func TestRelayKeyThatHangsCostsOnlyItself(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	release := make(chan struct{})
	sink := hangingStuckKey(release)
	var parked atomic.Int64
	r := stuckRelay(t, drv, sink, func(c *ferry.RelayConfig) {
		c.OnStuckKey = func(_ context.Context, k *ferry.StuckKey) {
			if k.State == ferry.KeyParked && k.Key == "stuck" {
				parked.Add(1)
			}
		}
	})
	run(t, r)
	keys := keysFor(9)
	events, committed := paced(t, c, keys, 400, 5*time.Millisecond)
	others := 0
	for _, e := range events {
		if e.Key != "stuck" {
			others++
		}
	}
	require.Eventually(t, func() bool { return len(latencies(sink, committed, "stuck")) >= others }, 20*time.Second, 10*time.Millisecond,
		"the other keys' events arrive while one key hangs")
	lat := latencies(sink, committed, "stuck")
	t.Logf("other keys while one hangs: %d events, p99 commit→stored %v, max %v", len(lat), p99(lat), lat[len(lat)-1])
	require.Less(t, p99(lat), time.Second)
	require.EqualValues(t, 1, parked.Load(), "the stuck key was parked once")

	close(release)
	require.Eventually(t, func() bool { return sink.Len() >= len(events) }, 20*time.Second, 10*time.Millisecond, "the stuck key's events arrive once it answers")
	checkDelivery(t, events, sink.Stored(), true)
	// The last parked row goes once its ack has been applied, just after
	// the sink stored the event.
	require.Eventually(t, func() bool {
		heads, err := drv.ParkedHeads(context.Background(), &ferrydriver.ParkedHeadsParams{Feed: "default/0"})
		require.NoError(t, err)
		return len(heads) == 0
	}, 10*time.Second, 10*time.Millisecond, "nothing stays parked")
}

// TestRelayParksAKeyWithSeveralEventsInFlight: on a sink that keeps a key's
// order within a call (Kafka's), the relay sends several events of a key at
// once. The destination hangs for that key until it is parked; the events in
// flight stay its head, and once they are answered every event of the key
// arrives, in order. (Parking kept only one of them, and the relay crashed
// when the others were answered.)
func TestRelayParksAKeyWithSeveralEventsInFlight(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ctx := context.Background()
	var events []*ferry.Event
	for i := range 5 {
		ev := &ferry.Event{Topic: "t", Key: "stuck", Type: "T", Payload: []byte(strconv.Itoa(i))}
		require.NoError(t, c.Emit(ctx, ev))
		events = append(events, ev)
	}
	release := make(chan struct{})
	var inFlight atomic.Int64 // the most events of the stuck key in one call
	sink := hangingStuckKey(release)
	sink.Ordered = true
	sink.OnPublish = func(_ context.Context, evs []*ferryevent.Event) {
		n := int64(0)
		for _, e := range evs {
			if e.Key == "stuck" {
				n++
			}
		}
		for cur := inFlight.Load(); n > cur && !inFlight.CompareAndSwap(cur, n); cur = inFlight.Load() {
		}
	}
	parked := make(chan struct{})
	var once sync.Once
	r := stuckRelay(t, drv, sink, func(c *ferry.RelayConfig) {
		c.OnStuckKey = func(_ context.Context, k *ferry.StuckKey) {
			if k.State == ferry.KeyParked && k.Key == "stuck" {
				once.Do(func() { close(parked) })
			}
		}
	})
	run(t, r)
	// Other keys' acknowledgements are what tells a stuck key from an outage.
	more, _ := paced(t, c, keysFor(4), 100, 5*time.Millisecond)
	events = append(events, more...)
	select {
	case <-parked:
	case <-time.After(30 * time.Second):
		t.Fatal("the stuck key was never parked")
	}
	require.GreaterOrEqual(t, inFlight.Load(), int64(5), "the relay sent the stuck key's first events in one call")
	close(release)
	require.Eventually(t, func() bool { return sink.Len() >= len(events) }, 30*time.Second, 10*time.Millisecond, "every event arrives once the key is answered")
	checkDelivery(t, events, sink.Stored(), true)
	require.Eventually(t, func() bool {
		heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "default/0"})
		require.NoError(t, err)
		return len(heads) == 0
	}, 10*time.Second, 10*time.Millisecond, "nothing stays parked")
}

// TestRelayFailingKeyRecovers: one key's publishes fail for a while (as a
// receiver answering 503), the others flow; it then recovers and its events
// arrive in order.
func TestRelayFailingKeyRecovers(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	sink, failing := failingStuckKey()
	run(t, stuckRelay(t, drv, sink, nil))
	events, committed := paced(t, c, keysFor(9), 300, 5*time.Millisecond)
	stuck := 0
	for _, e := range events {
		if e.Key == "stuck" {
			stuck++
		}
	}
	require.Eventually(t, func() bool { return len(latencies(sink, committed, "stuck")) >= len(events)-stuck }, 20*time.Second, 10*time.Millisecond)
	lat := latencies(sink, committed, "stuck")
	t.Logf("other keys while one fails: p99 commit→stored %v", p99(lat))
	require.Less(t, p99(lat), time.Second)
	failing.Store(false)
	require.Eventually(t, func() bool { return sink.Len() >= len(events) }, 20*time.Second, 10*time.Millisecond)
	checkDelivery(t, events, sink.Stored(), true)
}

// TestRelayContinuePolicyDeadLettersAKeyThatKeepsFailing: after MaxAttempts
// the event is dead-lettered and the key's next one is tried.
func TestRelayContinuePolicyDeadLettersAKeyThatKeepsFailing(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ctx := context.Background()
	bad := &ferry.Event{Topic: "t", Key: "stuck", Type: "T", Payload: []byte("bad")}
	next := &ferry.Event{Topic: "t", Key: "stuck", Type: "T", Payload: []byte("next")}
	other := &ferry.Event{Topic: "t", Key: "k0", Type: "T"}
	require.NoError(t, c.Emit(ctx, bad, next, other))
	sink := &memsink.Sink{Fail: func(e *ferryevent.Event) bool { return string(e.Payload) == "bad" }}
	var mu sync.Mutex
	var alerts []ferry.KeyState
	run(t, stuckRelay(t, drv, sink, func(c *ferry.RelayConfig) {
		c.MaxAttempts, c.DeadPolicy = 3, ferry.Continue
		c.OnStuckKey = func(_ context.Context, k *ferry.StuckKey) {
			mu.Lock()
			defer mu.Unlock()
			alerts = append(alerts, k.State)
		}
	}))
	require.Eventually(t, func() bool { return sink.Len() == 2 }, 20*time.Second, 10*time.Millisecond)
	got := sink.Stored()
	require.ElementsMatch(t, []string{next.ID.String(), other.ID.String()}, []string{got[0].ID.String(), got[1].ID.String()})
	require.Eventually(t, func() bool {
		dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: "default/0"})
		return err == nil && len(dls) == 1 && dls[0].Event.ID == bad.ID
	}, 10*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, alerts, ferry.KeyDeadLettered)
}

// TestRelayHoldPolicyHoldsAKeyUntilReleased: after MaxAttempts the key is
// held with its later events parked behind it; skipping the head releases
// them, in order.
func TestRelayHoldPolicyHoldsAKeyUntilReleased(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ctx := context.Background()
	bad := &ferry.Event{Topic: "t", Key: "stuck", Type: "T", Payload: []byte("bad")}
	require.NoError(t, c.Emit(ctx, bad))
	sink := &memsink.Sink{Fail: func(e *ferryevent.Event) bool { return string(e.Payload) == "bad" }}
	held := make(chan struct{}, 1)
	run(t, stuckRelay(t, drv, sink, func(c *ferry.RelayConfig) {
		c.MaxAttempts = 3
		c.OnStuckKey = func(_ context.Context, k *ferry.StuckKey) {
			if k.State == ferry.KeyHeld {
				held <- struct{}{}
			}
		}
	}))
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("the key was not held")
	}
	var later []*ferry.Event
	for i := range 5 {
		ev := &ferry.Event{Topic: "t", Key: "stuck", Type: "T", Payload: []byte(strconv.Itoa(i))}
		require.NoError(t, c.Emit(ctx, ev))
		later = append(later, ev)
	}
	other := &ferry.Event{Topic: "t", Key: "k0", Type: "T"}
	require.NoError(t, c.Emit(ctx, other))
	require.Eventually(t, func() bool { return sink.Len() == 1 }, 10*time.Second, 10*time.Millisecond, "other keys flow")
	require.Equal(t, other.ID, sink.Stored()[0].ID)
	require.Eventually(t, func() bool {
		heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "default/0"})
		return err == nil && len(heads) == 1 && heads[0].Held && heads[0].Queued == 6
	}, 10*time.Second, 10*time.Millisecond, "the held key's later events are parked behind it")
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 1, sink.Len(), "a held key's later events wait")

	require.NoError(t, drv.ReleaseParked(ctx, &ferrydriver.ReleaseParkedParams{Feed: "default/0", Key: "stuck", Skip: true}))
	require.Eventually(t, func() bool { return sink.Len() == 6 }, 20*time.Second, 10*time.Millisecond, "released: the later events go, in order")
	var got []string
	for _, e := range sink.Stored()[1:] {
		got = append(got, e.ID.String())
	}
	var want []string
	for _, e := range later {
		want = append(want, e.ID.String())
	}
	require.Equal(t, want, got, "the held key's later events, once each, in order")
	dl, err := drv.GetDeadLetter(ctx, ferrydriver.DeadLetterRef{Feed: "default/0", EventID: bad.ID})
	require.NoError(t, err)
	require.Contains(t, dl.Reason, "skipped by an operator")
}

// TestRelayResumesParkedKeysAfterRestart: a key parked by one relay is
// published, in order, by the next one once its destination answers.
func TestRelayResumesParkedKeysAfterRestart(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	sink, failing := failingStuckKey()
	stop := run(t, stuckRelay(t, drv, sink, nil))
	events, _ := paced(t, c, keysFor(3), 60, 5*time.Millisecond)
	ctx := context.Background()
	require.Eventually(t, func() bool {
		heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "default/0"})
		return err == nil && len(heads) == 1 && heads[0].Queued == 15
	}, 20*time.Second, 10*time.Millisecond, "the stuck key's 15 events are parked")
	require.Eventually(t, func() bool { return sink.Len() == 45 }, 20*time.Second, 10*time.Millisecond)
	stop()
	failing.Store(false)
	run(t, stuckRelay(t, drv, sink, nil))
	require.Eventually(t, func() bool { return sink.Len() >= 60 }, 20*time.Second, 10*time.Millisecond)
	checkDelivery(t, events, sink.Stored(), true)
}

// TestRelayParkedKeyRefusedForGoodIsReported: a parked key's events that
// the sink then refuses for good (ferrysink.Permanent) are dead-lettered
// as an unparked key's are: logged, counted in
// ferry_relay_dead_letters_total, and told to OnStuckKey.
func TestRelayParkedKeyRefusedForGoodIsReported(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ctx := context.Background()
	var failing, refusing atomic.Bool
	failing.Store(true)
	sink := &memsink.Sink{
		Fail:      func(e *ferryevent.Event) bool { return e.Key == "stuck" && failing.Load() },
		Permanent: func(e *ferryevent.Event) bool { return e.Key == "stuck" && refusing.Load() },
	}
	reg := prometheus.NewRegistry()
	var logs syncbuf.Buffer
	var mu sync.Mutex
	states := map[ferry.KeyState]int{}
	run(t, stuckRelay(t, drv, sink, func(c *ferry.RelayConfig) {
		c.Hooks = []ferryhook.Hook{ferryprom.New(reg)}
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.OnStuckKey = func(_ context.Context, k *ferry.StuckKey) {
			if k.Key == "stuck" {
				mu.Lock()
				states[k.State]++
				mu.Unlock()
			}
		}
	}))
	seen := func(s ferry.KeyState) int {
		mu.Lock()
		defer mu.Unlock()
		return states[s]
	}
	events, _ := paced(t, c, keysFor(4), 50, 5*time.Millisecond)
	stuck := 0
	for _, e := range events {
		if e.Key == "stuck" {
			stuck++
		}
	}
	require.Eventually(t, func() bool { return seen(ferry.KeyParked) > 0 }, 30*time.Second, 10*time.Millisecond, "the failing key is parked")
	refusing.Store(true)
	failing.Store(false)
	require.Eventually(t, func() bool {
		dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: "default/0"})
		return err == nil && len(dls) == stuck
	}, 30*time.Second, 10*time.Millisecond, "the parked key's events are dead-lettered")
	// A parked key's dead letter is stored before it is counted and told:
	// the last one's count, call and log may follow the read above.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, float64(stuck), counter(t, reg, "ferry_relay_dead_letters_total", ""), "each counted")
		assert.Equal(c, stuck, seen(ferry.KeyDeadLettered), "each told to OnStuckKey")
		assert.Equal(c, stuck, strings.Count(logs.String(), "event dead-lettered"), "each logged")
	}, 10*time.Second, 10*time.Millisecond)
}

// TestRelayParkedKeysBeyondTheLoadCapKeepTheirOrder: the store holds
// more parked keys than a leadership loads at once (the cap, lowered to 2
// here from 100,000): the keys past it still publish their parked events
// before their new ones, and every parked event is published, those of
// keys with no new event too.
func TestRelayParkedKeysBeyondTheLoadCapKeepTheirOrder(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ctx := context.Background()
	const keys = 7
	// A former leader parked one event of each key.
	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "former", TTL: time.Minute})
	require.NoError(t, err)
	var old []*ferryevent.Event
	for i := range keys {
		ev := &ferryevent.Event{Topic: "t", Key: "p" + strconv.Itoa(i), Type: "T", Payload: []byte("old")}
		require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
		old = append(old, ev)
	}
	require.NoError(t, drv.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: "default/0", Holder: "former", Term: l.Term, Events: old, Reason: "down"}))
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "former", Term: l.Term}))
	// New events of most of those keys are in the outbox when the relay
	// starts; the last two keys have none (a later scan loads them).
	const withNew = keys - 2
	for i := range withNew {
		require.NoError(t, c.Emit(ctx, &ferry.Event{Topic: "t", Key: "p" + strconv.Itoa(i), Type: "T", Payload: []byte("new")}))
	}
	sink := &memsink.Sink{}
	r := stuckRelay(t, drv, sink, nil)
	ferry.SetParkedLoadCap(r, 2)
	run(t, r)
	require.Eventually(t, func() bool { return sink.Len() >= keys+withNew }, 30*time.Second, 10*time.Millisecond, "every event is published")
	got := map[string][]string{}
	for _, e := range sink.Stored() {
		got[e.Key] = append(got[e.Key], string(e.Payload))
	}
	for i := range keys {
		k := "p" + strconv.Itoa(i)
		want := []string{"old", "new"}
		if i >= withNew {
			want = []string{"old"}
		}
		require.Equal(t, want, got[k], "key %s: its parked event first", k)
	}
}

// TestRelayMaxAttemptsCountAcrossLeaderships: a parked key's failed
// attempts are stored with it, so that the next leader goes on counting
// towards MaxAttempts instead of starting afresh (a relay rebalanced more
// often than its limits allow would otherwise never give up).
func TestRelayMaxAttemptsCountAcrossLeaderships(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ctx := context.Background()
	bad := &ferry.Event{Topic: "t", Key: "stuck", Type: "T", Payload: []byte("bad")}
	require.NoError(t, c.Emit(ctx, bad))
	var tries atomic.Int64
	sink := &memsink.Sink{Fail: func(e *ferryevent.Event) bool {
		if e.ID == bad.ID {
			tries.Add(1)
			return true
		}
		return false
	}}
	const maxAttempts = 10
	parked := make(chan struct{})
	var once sync.Once
	mod := func(c *ferry.RelayConfig) {
		c.MaxAttempts, c.DeadPolicy = maxAttempts, ferry.Continue
		// Slow retries: the first leader is stopped half-way.
		c.RetryBase, c.RetryMax = 300*time.Millisecond, 300*time.Millisecond
		c.OnStuckKey = func(_ context.Context, k *ferry.StuckKey) {
			if k.State == ferry.KeyParked {
				once.Do(func() { close(parked) })
			}
		}
	}
	stop := run(t, stuckRelay(t, drv, sink, mod))
	// Other keys flow, which tells the failing key from an outage: it is
	// parked.
	paced(t, c, keysFor(3)[1:], 40, 10*time.Millisecond)
	select {
	case <-parked:
	case <-time.After(30 * time.Second):
		t.Fatal("the failing key was never parked")
	}
	require.Eventually(t, func() bool { return tries.Load() >= 4 }, 30*time.Second, 10*time.Millisecond, "the first leader retries the parked key")
	stop()
	first := tries.Load()
	require.Less(t, first, int64(maxAttempts), "the first leader has not given up yet")

	// A new leadership: it goes on counting.
	run(t, stuckRelay(t, drv, sink, mod))
	require.Eventually(t, func() bool {
		dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: "default/0"})
		return err == nil && len(dls) == 1 && dls[0].Event.ID == bad.ID
	}, 30*time.Second, 10*time.Millisecond, "the event is dead-lettered")
	t.Logf("attempts: %d under the first leader, %d in all", first, tries.Load())
	// One attempt more than recorded may have been in flight when the first
	// leader stopped.
	require.LessOrEqual(t, tries.Load(), int64(maxAttempts+1), "MaxAttempts counts the attempts of both leaderships")
}
