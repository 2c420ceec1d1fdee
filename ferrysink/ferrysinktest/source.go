package ferrysinktest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// SourceHarness connects the source suite to one broker.
type SourceHarness struct {
	// New returns a fresh destination that no other test shares: publish
	// stores events there in the order given (as the broker's sink does),
	// and newSource returns a source reading it as one consumer group,
	// resuming after what earlier sources of the same destination
	// acknowledged. New registers the destination's removal with t.Cleanup.
	New func(t *testing.T) (publish func(ctx context.Context, events []*ferryevent.Event) error, newSource func(t *testing.T) ferrysink.Source)
	// System is the broker the source names for telemetry
	// (ferrysink.Describer): "nats", "kafka", "rabbitmq"; empty when it
	// names none.
	System string
}

// ExerciseSource runs the source conformance suite: every event delivered
// with each key's order kept, a failed ingest retried before anything later
// of its key, a restart resuming after what was acknowledged (and before
// what was not), a prompt stop, and the system it names.
func ExerciseSource(t *testing.T, h SourceHarness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("ferrysinktest: SourceHarness.New is nil")
	}

	t.Run("NamesItsSystem", func(t *testing.T) {
		t.Parallel()
		_, newSource := h.New(t)
		got := ""
		if d, ok := newSource(t).(ferrysink.Describer); ok {
			got = d.System()
		}
		require.Equal(t, h.System, got, "the source's System() (ferrysink.Describer) names its deliveries' transport on receive spans and the ingest metric")
	})

	t.Run("DeliversInKeyOrder", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		publish, newSource := h.New(t)
		want := publishKeys(ctx, t, publish, "order", 20, 25)
		rec := &recorder{}
		stop := runSource(ctx, t, newSource(t), rec.ingest(nil))
		rec.await(ctx, t, want)
		stop()
		requireInOrderAtLeastOnce(t, rec.stored(), want, true)
	})

	t.Run("FailedIngestIsRetriedFirst", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		publish, newSource := h.New(t)
		want := publishKeys(ctx, t, publish, "retry", 10, 20)
		target := want["retry-3"][7]
		var mu sync.Mutex
		failures := 0
		rec := &recorder{}
		stop := runSource(ctx, t, newSource(t), rec.ingest(func(events []*ferryevent.Event) error {
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range events {
				if ev.ID == target && failures < 3 {
					failures++
					return errors.New("ferrysinktest: ingest fails on purpose")
				}
			}
			return nil
		}))
		rec.await(ctx, t, want)
		stop()
		mu.Lock()
		require.Equal(t, 3, failures, "the failing event must come back until ingest accepts it")
		mu.Unlock()
		requireInOrderAtLeastOnce(t, rec.stored(), want, true)
	})

	t.Run("RestartResumesAfterAcknowledged", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		publish, newSource := h.New(t)
		first := publishKeys(ctx, t, publish, "restart", 10, 20)
		a := &recorder{}
		stop := runSource(ctx, t, newSource(t), a.ingest(nil))
		a.await(ctx, t, first)
		stop() // Run acknowledges what ingest accepted, even as it stops

		second := publishKeys(ctx, t, publish, "restart2", 10, 10)
		b := &recorder{}
		stop = runSource(ctx, t, newSource(t), b.ingest(nil))
		b.await(ctx, t, second)
		stop()
		for _, s := range b.stored() {
			require.False(t, a.has(s.Event.ID), "event %s was acknowledged by the first source and delivered again", s.Event.ID)
		}
	})

	t.Run("UnacknowledgedComeBack", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		publish, newSource := h.New(t)
		want := publishKeys(ctx, t, publish, "unacked", 5, 10)
		attempts := make(chan struct{}, 1)
		failing := func(context.Context, []*ferryevent.Event) error {
			select {
			case attempts <- struct{}{}:
			default:
			}
			return errors.New("ferrysinktest: ingest refuses everything")
		}
		stop := runSource(ctx, t, newSource(t), failing)
		select {
		case <-attempts:
		case <-ctx.Done():
			t.Fatal("the source never called ingest")
		}
		stop()
		b := &recorder{}
		stop = runSource(ctx, t, newSource(t), b.ingest(nil))
		b.await(ctx, t, want)
		stop()
		requireInOrderAtLeastOnce(t, b.stored(), want, true)
	})

	t.Run("StopsPromptly", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		_, newSource := h.New(t)
		stop := runSource(ctx, t, newSource(t), func(context.Context, []*ferryevent.Event) error { return nil })
		time.Sleep(200 * time.Millisecond)
		stop()
	})
}

// publishKeys publishes perKey events for each of keys keys, one event per
// key per call, and returns each key's IDs in order.
func publishKeys(ctx context.Context, t *testing.T, publish func(context.Context, []*ferryevent.Event) error, prefix string, keys, perKey int) map[string][]uuid.UUID {
	t.Helper()
	want := make(map[string][]uuid.UUID, keys)
	for s := range perKey {
		batch := make([]*ferryevent.Event, 0, keys)
		for k := range keys {
			key := prefix + "-" + strconv.Itoa(k)
			ev := newEvent("orders", key, int64(s+1))
			batch = append(batch, ev)
			want[key] = append(want[key], ev.ID)
		}
		require.NoError(t, publish(ctx, batch), "publish through the harness")
	}
	return want
}

// runSource runs src until the returned stop is called; stop cancels Run
// and checks that it returns nil (a stop asked for is not an error: the
// shape of ferry.Relay.Run and ferry.Consumer.Run) within promptReturn.
func runSource(ctx context.Context, t *testing.T, src ferrysink.Source, ingest func(context.Context, []*ferryevent.Event) error) (stop func()) {
	t.Helper()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(rctx, ingest) }()
	return func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "Run returns nil once its context is cancelled")
		case <-time.After(promptReturn):
			t.Fatalf("Run did not return within %s of its context being cancelled", promptReturn)
		}
	}
}

// recorder keeps what ingest accepted, in order.
type recorder struct {
	mu     sync.Mutex
	events []Stored
	ids    map[uuid.UUID]bool
}

func (r *recorder) ingest(fail func([]*ferryevent.Event) error) func(context.Context, []*ferryevent.Event) error {
	return func(_ context.Context, events []*ferryevent.Event) error {
		if fail != nil {
			if err := fail(events); err != nil {
				return err
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.ids == nil {
			r.ids = map[uuid.UUID]bool{}
		}
		for _, ev := range events {
			r.events = append(r.events, Stored{Event: *ev})
			r.ids[ev.ID] = true
		}
		return nil
	}
}

func (r *recorder) has(id uuid.UUID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[id]
}

func (r *recorder) stored() []Stored {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Stored(nil), r.events...)
}

// await waits until every event of want was ingested.
func (r *recorder) await(ctx context.Context, t *testing.T, want map[string][]uuid.UUID) {
	t.Helper()
	for {
		missing := 0
		r.mu.Lock()
		for _, ids := range want {
			for _, id := range ids {
				if !r.ids[id] {
					missing++
				}
			}
		}
		r.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d events were never ingested", missing)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
