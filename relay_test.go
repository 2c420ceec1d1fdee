package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func newPG(t *testing.T) *ferrypg.Driver[pgx.Tx] {
	t.Helper()
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv
}

func quickRelay(t *testing.T, drv ferrydriver.Store, sink *memsink.Sink, holder string) *ferry.Relay {
	t.Helper()
	r, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{
		HolderID: holder, PollInterval: 50 * time.Millisecond, LeaseTTL: 2 * time.Second,
		RetryBase: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond,
		RetentionInterval: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	return r
}

func run(t *testing.T, r *ferry.Relay) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("relay did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// emitMany emits n events over keys from writers concurrent transactions.
func emitMany(t *testing.T, c *ferry.Client[pgx.Tx], n, keys, writers int, payload func(i int) string) []*ferry.Event {
	t.Helper()
	ctx := context.Background()
	pool := ferrypgtest.Pool(t)
	var mu sync.Mutex
	var all []*ferry.Event
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += writers {
				ev := &ferry.Event{Topic: "orders", Key: "k" + strconv.Itoa(i%keys), Type: "T", Payload: []byte(payload(i))}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return c.EmitTx(ctx, tx, ev) })
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				all = append(all, ev)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return all
}

// checkDelivery asserts every event is stored once and each key is in Seq order.
func checkDelivery(t *testing.T, want []*ferry.Event, stored []ferryevent.Event, allowDup bool) {
	t.Helper()
	count := map[string]int{}
	last := map[string]int64{}
	for _, e := range stored {
		count[e.ID.String()]++
		require.Greater(t, e.Seq, last[e.Key], "key %s out of order", e.Key)
		if !allowDup {
			require.Equal(t, last[e.Key]+1, e.Seq, "key %s has a gap", e.Key)
		}
		last[e.Key] = e.Seq
	}
	for _, e := range want {
		require.NotZero(t, count[e.ID.String()], "event %s missing", e.ID)
		if !allowDup {
			require.Equal(t, 1, count[e.ID.String()], "event %s duplicated", e.ID)
		}
	}
}

func TestRelayDeliversInKeyOrder(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	sink := &memsink.Sink{}
	stop := run(t, quickRelay(t, drv, sink, "r1"))
	all := emitMany(t, c, 2000, 50, 8, func(i int) string { return strconv.Itoa(i) })
	require.Eventually(t, func() bool { return sink.Len() >= len(all) }, 30*time.Second, 20*time.Millisecond)
	stop()
	checkDelivery(t, all, sink.Stored(), false)

	st, err := drv.FeedStatus(context.Background(), &ferrydriver.FeedStatusParams{Feed: "default/0"})
	require.NoError(t, err)
	require.Zero(t, st.LagEvents, "the final checkpoint covers every event")
	lease, err := drv.GetLease(context.Background(), "default/0")
	require.NoError(t, err)
	require.False(t, heldBy(lease, "r1"), "a stopped relay releases its lease")
}

func TestRelayRetriesTransientFailuresInOrder(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	sink := &memsink.Sink{FailRate: 0.3}
	run(t, quickRelay(t, drv, sink, "r1"))
	all := emitMany(t, c, 1000, 20, 4, func(i int) string { return strconv.Itoa(i) })
	require.Eventually(t, func() bool { return sink.Len() >= len(all) }, 30*time.Second, 20*time.Millisecond)
	checkDelivery(t, all, sink.Stored(), false)
}

func TestRelayDeadLettersPermanentFailures(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	sink := &memsink.Sink{Permanent: func(e *ferryevent.Event) bool { return string(e.Payload) == "poison" }}
	run(t, quickRelay(t, drv, sink, "r1"))
	all := emitMany(t, c, 300, 10, 3, func(i int) string {
		if i%100 == 7 {
			return "poison"
		}
		return strconv.Itoa(i)
	})
	var good []*ferry.Event
	for _, e := range all {
		if string(e.Payload) != "poison" {
			good = append(good, e)
		}
	}
	require.Eventually(t, func() bool { return sink.Len() >= len(good) }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		dls, err := drv.ListDeadLetters(context.Background(), &ferrydriver.ListDeadLettersParams{Feed: "default/0"})
		return err == nil && len(dls) == 3
	}, 10*time.Second, 20*time.Millisecond)
	dls, err := drv.ListDeadLetters(context.Background(), &ferrydriver.ListDeadLettersParams{Feed: "default/0"})
	require.NoError(t, err)
	for _, dl := range dls {
		require.Equal(t, "poison", string(dl.Event.Payload))
		require.Contains(t, dl.Reason, "rejected by memsink")
	}
	require.Len(t, sink.Stored(), len(good), "no poison event reached the sink")
}

func TestRelayStandbyTakesOver(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	sink := &memsink.Sink{}
	stopA := run(t, quickRelay(t, drv, sink, "a"))
	require.Eventually(t, func() bool {
		l, err := drv.GetLease(context.Background(), "default/0")
		return err == nil && heldBy(l, "a")
	}, 10*time.Second, 20*time.Millisecond)
	run(t, quickRelay(t, drv, sink, "b"))
	first := emitMany(t, c, 200, 10, 2, func(i int) string { return fmt.Sprint(i) })
	require.Eventually(t, func() bool { return sink.Len() >= len(first) }, 10*time.Second, 20*time.Millisecond)
	stopA()
	second := emitMany(t, c, 200, 10, 2, func(i int) string { return fmt.Sprint(i) })
	require.Eventually(t, func() bool { return sink.Len() >= len(first)+len(second) }, 20*time.Second, 20*time.Millisecond)
	l, err := drv.GetLease(context.Background(), "default/0")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(l.Holder, "b#"), l.Holder)
	require.EqualValues(t, 2, l.Term)
	checkDelivery(t, append(first, second...), sink.Stored(), true)
}

func TestEmitValidation(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, &ferry.Config{MaxPayloadBytes: 1000})
	require.NoError(t, err)
	ctx := context.Background()
	// The limit counts the envelope too: brokers do.
	envelope := ferryevent.EnvelopeBytes(&ferry.Event{Topic: "t", Key: "k", Type: "T"})
	err = c.Emit(ctx, &ferry.Event{Topic: "t", Key: "k", Type: "T", Payload: make([]byte, 1001-envelope)})
	require.ErrorIs(t, err, ferryevent.ErrEventTooLarge)
	err = c.Emit(ctx, &ferry.Event{Topic: "t", Key: "k", Type: "T"}, &ferry.Event{Topic: "t", Type: "T"})
	require.ErrorIs(t, err, ferryevent.ErrEmptyKey)
	var ve *ferry.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, 1, ve.Index)
	st, err := drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: "default/0"})
	require.NoError(t, err)
	require.Zero(t, st.LagEvents, "a rejected call writes nothing")

	ev := &ferry.Event{Topic: "t", Key: "k", Type: "T", Payload: make([]byte, 1000-envelope)}
	require.NoError(t, c.Emit(ctx, ev))
	require.NotEqual(t, ferry.Event{}.ID, ev.ID, "the ID is filled in")
}

func TestRolledBackEmitIsNotPublished(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	sink := &memsink.Sink{}
	run(t, quickRelay(t, drv, sink, "r1"))
	ctx := context.Background()
	tx, err := ferrypgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, c.EmitTx(ctx, tx, &ferry.Event{Topic: "t", Key: "k", Type: "Gone"}))
	require.NoError(t, tx.Rollback(ctx))
	kept := &ferry.Event{Topic: "t", Key: "k", Type: "Kept"}
	require.NoError(t, c.Emit(ctx, kept))
	require.Eventually(t, func() bool { return sink.Len() == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, kept.ID, sink.Stored()[0].ID)
}

// failingStore fails chosen calls once, to check that the relay recovers.
type failingStore struct {
	ferrydriver.Store
	ferrydriver.KeySeqStore
	failLoad atomic.Bool
}

func (s *failingStore) LoadCheckpoint(ctx context.Context, feed string) (*ferrydriver.Checkpoint, error) {
	if s.failLoad.CompareAndSwap(true, false) {
		return nil, errors.New("injected: connection reset")
	}
	return s.Store.LoadCheckpoint(ctx, feed)
}

func TestRelayRecoversFromStoreErrors(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	store := &failingStore{Store: drv, KeySeqStore: drv}
	store.failLoad.Store(true)
	sink := &memsink.Sink{}
	stop := run(t, quickRelay(t, store, sink, "r1"))
	first := emitMany(t, c, 100, 10, 2, strconv.Itoa)
	require.Eventually(t, func() bool { return sink.Len() >= len(first) }, 20*time.Second, 20*time.Millisecond, "the relay retries after a failed checkpoint load")

	// Kill the feed's database session under the running relay.
	ctx := context.Background()
	var killed int
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx,
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = left($1, 63)`,
		"ferry feed "+drv.Schema()+" default/0").Scan(&killed))
	require.Equal(t, 1, killed, "the feed runs on one dedicated session")
	second := emitMany(t, c, 100, 10, 2, strconv.Itoa)
	require.Eventually(t, func() bool { return sink.Len() >= len(first)+len(second) }, 20*time.Second, 20*time.Millisecond, "the relay reconnects")
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	checkDelivery(t, append(first, second...), sink.Stored(), true)
}

func TestRelayConfigValidation(t *testing.T) {
	t.Parallel()
	sink := &memsink.Sink{}
	drv, err := ferrypg.New(nil, nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		cfg  ferry.RelayConfig
		want string
	}{
		{ferry.RelayConfig{BatchSize: -1}, "BatchSize"},
		{ferry.RelayConfig{PollInterval: time.Microsecond}, "PollInterval"},
		{ferry.RelayConfig{LeaseTTL: 10 * time.Millisecond}, "LeaseTTL"},
		{ferry.RelayConfig{Partition: -2}, "Partition"},
		{ferry.RelayConfig{RetryBase: time.Second, RetryMax: time.Millisecond}, "RetryBase"},
	} {
		_, err := ferry.NewRelay(drv, sink, &tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	_, err = ferry.NewRelay(nil, sink, nil)
	require.Error(t, err)
}

// dupSink is a sink whose destination drops every event it is given as a
// duplicate (a feed replaying what another feed published).
type dupSink struct {
	memsink.Sink
	dups atomic.Uint64
}

func (s *dupSink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	s.dups.Add(uint64(len(events)))
	return make([]error, len(events))
}

func (s *dupSink) PublishEach(ctx context.Context, events []*ferryevent.Event, done func(int, error)) []error {
	out := s.Publish(ctx, events)
	for i := range events {
		done(i, nil)
	}
	return out
}

func (s *dupSink) Duplicates() uint64 { return s.dups.Load() }

// TestRelayLogsDuplicatesOnceAHeartbeat: duplicates the destination drops
// are counted each time and logged at most once a heartbeat, with their
// count (a relay replaying a backlog logged a line per duplicate), and
// what is left is logged when the relay stops.
func TestRelayLogsDuplicatesOnceAHeartbeat(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	var logs syncbuf.Buffer
	sink := &dupSink{}
	r, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{BatchSize: 5, PollInterval: 20 * time.Millisecond, HeartbeatInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	stop := run(t, r)
	all := emitMany(t, c, 200, 20, 2, strconv.Itoa)
	require.Len(t, all, 200)
	require.Eventually(t, func() bool { return sink.Duplicates() == 200 }, 30*time.Second, 10*time.Millisecond)
	stop()
	lines := strings.Count(logs.String(), "destination dropped duplicates")
	require.LessOrEqual(t, lines, 2, "one line at the first, one at the stop: %s", logs.String())
	total := 0
	for _, m := range regexp.MustCompile(`destination dropped duplicates.* count=(\d+)`).FindAllStringSubmatch(logs.String(), -1) {
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		total += n
	}
	require.Equal(t, 200, total, "every duplicate is in a line's count")
}
