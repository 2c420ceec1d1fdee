package ferry_test

import (
	"context"
	"errors"
	"log/slog"
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
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// heldBy reports whether l is held, and by a Run of the relay named name
// (each Run holds the lease as "<name>#<random>").
func heldBy(l *ferrydriver.Lease, name string) bool {
	return l != nil && strings.HasPrefix(l.Holder, name+"#") && l.Held(l.Holder)
}

// TestRelaysWithOneHolderIDLeadOneAtATime: replicas configured with the same
// HolderID (one FERRY_HOLDER for all of them) must not share the lease.
func TestRelaysWithOneHolderIDLeadOneAtATime(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	sink := &memsink.Sink{}
	var leaders [2]func() float64
	for i := range leaders {
		reg := prometheus.NewRegistry()
		r, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{
			HolderID: "relay", PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second,
			RetryBase: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond, Hooks: []ferryhook.Hook{ferryprom.New(reg)},
		})
		require.NoError(t, err)
		run(t, r)
		leaders[i] = gaugeOf(t, reg, "ferry_relay_leader")
	}
	events := emitMany(t, c, 200, 10, 2, strconv.Itoa)
	// Sample both relays' leader gauges while they deliver and for a lease
	// TTL after: never both at once.
	deadline := time.Now().Add(3 * time.Second)
	both, one := 0, 0
	for time.Now().Before(deadline) || sink.Len() < len(events) {
		a, b := leaders[0](), leaders[1]()
		if a == 1 && b == 1 {
			both++
		}
		if a+b == 1 {
			one++
		}
		require.Less(t, time.Since(deadline), 20*time.Second, "events not delivered")
		time.Sleep(5 * time.Millisecond)
	}
	require.Zero(t, both, "two relays named %q led the feed at once", "relay")
	require.NotZero(t, one)
	l, err := drv.GetLease(context.Background(), "default/0")
	require.NoError(t, err)
	require.True(t, heldBy(l, "relay"), "lease holder %q", l.Holder)
	checkDelivery(t, events, sink.Stored(), true)
}

// gaugeOf returns a reader of the single-series gauge named name in reg.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) func() float64 {
	t.Helper()
	return func() float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == name && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no gauge %s", name)
		return 0
	}
}

// TestRelayStopsOnAPartitionTheSchemaLacks: a configuration the relay cannot
// serve ends Run with ErrMisconfigured instead of a retry loop.
func TestRelayStopsOnAPartitionTheSchemaLacks(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	r, err := ferry.NewRelay(drv, &memsink.Sink{}, &ferry.RelayConfig{Partition: 5, LeaseTTL: 2 * time.Second, RetryBase: 5 * time.Millisecond, RetryMax: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.NoError(t, ctx.Err(), "Run kept retrying")
	require.ErrorIs(t, err, ferry.ErrMisconfigured)
	require.ErrorContains(t, err, "partition 5")
}

// openFailingStore fails every OpenFeed with a transient error.
type openFailingStore struct {
	ferrydriver.Store
	ferrydriver.KeySeqStore
	opens atomic.Int64
}

func (s *openFailingStore) OpenFeed(context.Context, *ferrydriver.OpenFeedParams) (ferrydriver.Feed, error) {
	s.opens.Add(1)
	return nil, errors.New("injected: connection refused")
}

// logRecorder keeps the records of a slog.Logger.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

// attrs returns attribute key of every record whose message contains msg.
func (h *logRecorder) attrs(msg, key string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		if !strings.Contains(r.Message, msg) {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				out = append(out, a.Value.String())
			}
			return true
		})
	}
	return out
}

// TestRelayBacksOffAcrossLeaderships: a leadership that fails at once each
// time it is taken must not reset the backoff (it used to restart at the
// first step on every lease acquisition: ~26 errors a second).
func TestRelayBacksOffAcrossLeaderships(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	store := &openFailingStore{Store: drv, KeySeqStore: drv}
	rec := &logRecorder{}
	r, err := ferry.NewRelay(store, &memsink.Sink{}, &ferry.RelayConfig{
		LeaseTTL: 2 * time.Second, RetryBase: time.Millisecond, RetryMax: time.Hour, Logger: slog.New(rec),
	})
	require.NoError(t, err)
	stop := run(t, r)
	// Six leaderships failed and were logged (waiting for six opens only,
	// the stop could come between the sixth's failure and its record).
	require.Eventually(t, func() bool { return len(rec.attrs("stopped leading after an error", "attempt")) >= 6 }, 30*time.Second, 5*time.Millisecond)
	stop()
	require.GreaterOrEqual(t, store.opens.Load(), int64(6))
	got := rec.attrs("stopped leading after an error", "attempt")
	for i, a := range got {
		require.Equal(t, strconv.Itoa(i+1), a, "attempt numbers across leaderships: %v", got)
	}
}

// TestRelayRunsOnceAtATime: a second Run of the same Relay is refused.
func TestRelayRunsOnceAtATime(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	r := quickRelay(t, drv, &memsink.Sink{}, "once")
	stop := run(t, r)
	require.Eventually(t, func() bool {
		l, err := drv.GetLease(context.Background(), "default/0")
		return err == nil && heldBy(l, "once")
	}, 10*time.Second, 10*time.Millisecond)
	err := r.Run(context.Background())
	require.ErrorContains(t, err, "already running")
	stop()
	// Once stopped, it can run again.
	stop = run(t, r)
	stop()
}

// readFailingStore fails the feed's Read once, on the n-th call, and makes
// checkpoint saves slow, so that a delivered batch is still unsaved then.
type readFailingStore struct {
	ferrydriver.Store
	ferrydriver.KeySeqStore
	failOn int64
	reads  atomic.Int64
}

func (s *readFailingStore) OpenFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) (ferrydriver.Feed, error) {
	f, err := s.Store.OpenFeed(ctx, p)
	if err != nil {
		return nil, err
	}
	return &readFailingFeed{Feed: f, s: s}, nil
}

func (s *readFailingStore) SaveCheckpoint(ctx context.Context, p *ferrydriver.SaveCheckpointParams) error {
	select {
	case <-time.After(300 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.SaveCheckpoint(ctx, p)
}

type readFailingFeed struct {
	ferrydriver.Feed
	s *readFailingStore
}

func (f *readFailingFeed) Read(ctx context.Context, p *ferrydriver.ReadParams) (*ferrydriver.Batch, error) {
	if f.s.reads.Add(1) == f.s.failOn {
		return nil, errors.New("injected: the feed's session was terminated")
	}
	return f.Feed.Read(ctx, p)
}

// TestRelayFlushesTheCheckpointWhenAReadFails: a transient read error used
// to end the leadership without saving what was delivered, so the next one
// redelivered up to two batches.
func TestRelayFlushesTheCheckpointWhenAReadFails(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ctx := context.Background()
	var first []*ferry.Event
	for i := range 3 {
		ev := &ferry.Event{Topic: "t", Key: "k" + strconv.Itoa(i), Type: "T"}
		require.NoError(t, c.Emit(ctx, ev))
		first = append(first, ev)
	}
	store := &readFailingStore{Store: drv, KeySeqStore: drv, failOn: 4}
	sink := &memsink.Sink{}
	r, err := ferry.NewRelay(store, sink, &ferry.RelayConfig{
		HolderID: "r", BatchSize: 1, PollInterval: 20 * time.Millisecond, LeaseTTL: 5 * time.Second,
		RetryBase: time.Millisecond, RetryMax: 5 * time.Millisecond, HeartbeatInterval: time.Minute,
	})
	require.NoError(t, err)
	run(t, r)
	require.Eventually(t, func() bool { return store.reads.Load() > 4 }, 20*time.Second, 5*time.Millisecond, "the relay reads again after the failure")
	last := &ferry.Event{Topic: "t", Key: "k0", Type: "T"}
	require.NoError(t, c.Emit(ctx, last))
	require.Eventually(t, func() bool { return sink.Len() >= 4 && sink.Stored()[sink.Len()-1].ID == last.ID }, 20*time.Second, 5*time.Millisecond)
	checkDelivery(t, append(first, last), sink.Stored(), false)
}

// hangingSink does not return from Publish until the test ends, whatever
// its context says.
type hangingSink struct {
	calls   atomic.Int64
	release chan struct{}
}

func (s *hangingSink) Publish(_ context.Context, events []*ferryevent.Event) []error {
	s.calls.Add(1)
	<-s.release
	return make([]error, len(events))
}
func (s *hangingSink) Close(context.Context) error { return nil }

// TestShutdownTimeoutBoundsAHungPublish: Run returns within ShutdownTimeout
// of its context's end even when the sink ignores the context, and what was
// acknowledged before stays checkpointed.
func TestShutdownTimeoutBoundsAHungPublish(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	require.NoError(t, c.Emit(context.Background(), &ferry.Event{Topic: "t", Key: "k", Type: "T"}))
	sink := &hangingSink{release: make(chan struct{})}
	t.Cleanup(func() { close(sink.release) })
	r, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, LeaseTTL: 5 * time.Second, ShutdownTimeout: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return sink.calls.Load() > 0 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	stopped := time.Now()
	select {
	case err := <-done:
		// The bound is ShutdownTimeout; the slack is for a loaded machine.
		took := time.Since(stopped)
		t.Logf("Run returned %v after its context ended (ShutdownTimeout 1s)", took.Round(time.Millisecond))
		require.NoError(t, err)
		require.Less(t, took, 3*time.Second)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return while the sink's Publish hung")
	}
	l, err := drv.GetLease(context.Background(), "default/0")
	require.NoError(t, err)
	require.False(t, l.Held(l.Holder), "the lease is released")
}

// fenceSink hangs its calls, ignoring their context, until release is
// closed; then it records what the call's fence says (ferrysink.Fenced)
// and fails the events.
type fenceSink struct {
	entered chan struct{}
	release chan struct{}
	fenced  chan error
	once    sync.Once
}

func (s *fenceSink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	s.once.Do(func() { close(s.entered) })
	<-s.release
	err := ferrysink.Fenced(ctx)
	select {
	case s.fenced <- err:
	default:
	}
	out := make([]error, len(events))
	for i := range out {
		out[i] = errors.New("fenceSink: not published")
	}
	return out
}

func (s *fenceSink) Close(context.Context) error { return nil }

// TestRelayLostLeaseFencesAnAbandonedPublish: a relay whose sink call
// hangs (ignoring its context) loses its lease to another holder; the
// call, abandoned, resumes while the lease's local trust window would
// still be open: its fence must refuse, since a standby may lead now.
func TestRelayLostLeaseFencesAnAbandonedPublish(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	ctx := context.Background()
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	require.NoError(t, c.Emit(ctx, &ferry.Event{Topic: "t", Key: "k", Type: "T"}))
	sink := &fenceSink{entered: make(chan struct{}), release: make(chan struct{}), fenced: make(chan error, 1)}
	var logs syncbuf.Buffer
	// Renewed every 5 s, trusted for 13 s after each renewal: the window
	// is still open some 8 s after the renewal that finds the lease lost.
	r, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{
		HolderID: "r1", PollInterval: 20 * time.Millisecond, LeaseTTL: 15 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.NoError(t, err)
	run(t, r)
	select {
	case <-sink.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never called the sink")
	}
	defer close(sink.release)
	// Another holder takes the lease over.
	l, err := drv.GetLease(ctx, "default/0")
	require.NoError(t, err)
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: l.Holder, Term: l.Term}))
	_, err = drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "thief", TTL: time.Hour})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "lost its lease") }, 60*time.Second, 10*time.Millisecond,
		"the relay notices it lost its lease (at its next renewal)")
	sink.release <- struct{}{}
	select {
	case err := <-sink.fenced:
		require.Error(t, err, "an abandoned publish after the lease was lost passes no fence")
	case <-time.After(10 * time.Second):
		t.Fatal("the sink call did not resume")
	}
}

// TestRelayReleasedLeaseFencesAnAbandonedPublish: a stopping relay whose
// sink call hangs (ignoring its context) abandons it at ShutdownTimeout
// and releases its lease; the call, resumed after that, must not pass its
// fence, though the lease's trust window would still be open.
func TestRelayReleasedLeaseFencesAnAbandonedPublish(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	ctx := context.Background()
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	require.NoError(t, c.Emit(ctx, &ferry.Event{Topic: "t", Key: "k", Type: "T"}))
	sink := &fenceSink{entered: make(chan struct{}), release: make(chan struct{}), fenced: make(chan error, 1)}
	r, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{
		HolderID: "r1", PollInterval: 20 * time.Millisecond, LeaseTTL: 15 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		ShutdownTimeout: time.Second,
	})
	require.NoError(t, err)
	stop := run(t, r)
	select {
	case <-sink.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never called the sink")
	}
	defer close(sink.release)
	stop() // returns once the relay released its lease
	l, err := drv.GetLease(ctx, "default/0")
	require.NoError(t, err)
	require.False(t, l.Held(l.Holder), "the lease was released")
	sink.release <- struct{}{}
	select {
	case err := <-sink.fenced:
		require.Error(t, err, "an abandoned publish after the lease was released passes no fence")
	case <-time.After(10 * time.Second):
		t.Fatal("the sink call did not resume")
	}
}
