// Package ferrysinktest is the conformance suite for ferrysink.Sink
// implementations. Every sink runs Exercise from its own tests against a real
// destination:
//
//	func TestConformance(t *testing.T) {
//		ferrysinktest.Exercise(t, ferrysinktest.Harness{
//			Features: ferrysinktest.Features{BrokerDedup: true},
//			New: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc) {
//				// Create an isolated destination, register its removal
//				// with t.Cleanup, and return a sink publishing into it
//				// plus a function reading back what it stored.
//			},
//		})
//	}
//
// The suite checks what the relay relies on: every event attribute survives
// the trip, per-key order holds across calls, nothing is lost under
// concurrency, permanent failures are reported as ferrysink.PermanentError
// without failing the rest of the call, a cancelled context ends Publish
// promptly and is never reported as permanent, and Close is idempotent.
// Capabilities that not every destination has are declared in Features;
// the subtests for undeclared ones are skipped.
//
// Changing the ferrysink contract means extending this suite.
//
// Stability: this package may change between minor versions until 1.0.
package ferrysinktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryevent/ferryeventtest"
	"github.com/ferry-dev/ferry/ferrysink"
)

// Features declares what the destination behind a sink can do, so that the
// suite checks it. The zero value declares nothing optional.
type Features struct {
	// BrokerDedup declares that the destination drops a second publish of
	// an event ID it has already stored (JetStream's Nats-Msg-Id within the
	// stream's duplicate window, for example). The suite then checks that
	// publishing the same event twice stores it once.
	BrokerDedup bool
	// MaxPayloadBytes, when > 0, declares that the destination rejects
	// payloads larger than this. The suite then checks that such an event
	// fails with a ferrysink.PermanentError while the other events of the
	// same call are still published.
	MaxPayloadBytes int
	// Persistent declares that the destination keeps what it acknowledged
	// across a restart of the broker. The harness's NewFaulty interrupt
	// should then restart it (at least once in three calls), so that
	// NoLossAcrossInterruptions checks it.
	Persistent bool
	// UnroutableTopic, when not empty, names a topic the destination has no
	// route for. The suite then checks that publishing it fails with a
	// ferrysink.PermanentError.
	UnroutableTopic string
}

// Stored is one message read back from the destination, decoded into an
// event.
type Stored struct {
	// Event holds what the destination stored: ID, Topic, Key, Type,
	// Source, Headers (the user's headers only, none of the sink's own),
	// ContentType, Payload, CreatedAt and Seq.
	Event ferryevent.Event
}

// ReadFunc returns everything stored in a destination so far, in the
// destination's order (for a log such as a stream or a partition, the order
// of its offsets or sequence numbers).
type ReadFunc func(ctx context.Context) ([]Stored, error)

// Harness connects the suite to one sink implementation.
type Harness struct {
	// Features declares the destination's optional capabilities.
	Features Features
	// New returns a sink publishing into a fresh destination that no other
	// test shares (a stream, topic or queue with a unique name), and a
	// function that reads back what is stored there. New registers the
	// destination's removal with t.Cleanup; the suite closes the sink.
	// It is called from parallel subtests and must be safe for that.
	New func(t *testing.T) (ferrysink.Sink, ReadFunc)
	// NewFaulty is New plus interrupt (required): a function that breaks
	// the path between this sink and its destination once (restarts the
	// broker, resets the connection through a proxy, closes the server's
	// sockets) and returns when the destination can be reached again. The
	// suite then publishes as the relay does, retrying what failed, across
	// several interruptions, and checks that nothing is lost and each
	// key's order holds.
	NewFaulty func(t *testing.T) (ferrysink.Sink, ReadFunc, func())
}

// Timing bounds used by the suite. They are generous guards, not
// measurements: a correct sink against a local server stays far below them.
const (
	// testTimeout bounds each subtest's context.
	testTimeout = 60 * time.Second
	// promptReturn is how long Publish may take to return once its context
	// is done.
	promptReturn = 5 * time.Second
)

// Exercise runs the conformance suite against the sink built by h. The
// subtests run in parallel, each with its own destination.
func Exercise(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("ferrysinktest: Harness.New is nil; set it to a function returning a sink and a ReadFunc")
	}

	t.Run("PublishEmpty", func(t *testing.T) { testPublishEmpty(t, h) })
	t.Run("RoundTrip", func(t *testing.T) { testRoundTrip(t, h) })
	t.Run("CodecsRoundTrip", func(t *testing.T) { testCodecsRoundTrip(t, h) })
	t.Run("EdgeCases", func(t *testing.T) { testEdgeCases(t, h) })
	t.Run("PerKeyOrderAcrossCalls", func(t *testing.T) { testPerKeyOrderAcrossCalls(t, h) })
	t.Run("ConcurrentPublishers", func(t *testing.T) { testConcurrentPublishers(t, h) })
	t.Run("BrokerDedup", func(t *testing.T) { testBrokerDedup(t, h) })
	t.Run("EachReportsEveryOutcome", func(t *testing.T) { testEachReportsEveryOutcome(t, h) })
	t.Run("FenceStopsHandOff", func(t *testing.T) { testFenceStopsHandOff(t, h) })
	t.Run("PayloadTooLarge", func(t *testing.T) { testPayloadTooLarge(t, h) })
	t.Run("UnroutableTopic", func(t *testing.T) { testUnroutableTopic(t, h) })
	t.Run("CancelledContext", func(t *testing.T) { testCancelledContext(t, h) })
	t.Run("CancelDuringPublish", func(t *testing.T) { testCancelDuringPublish(t, h) })
	t.Run("CloseFlushesInFlight", func(t *testing.T) { testCloseFlushesInFlight(t, h) })
	t.Run("NoLossAcrossInterruptions", func(t *testing.T) { testNoLossAcrossInterruptions(t, h) })
	t.Run("CloseTwice", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		sink, read := newSink(t, h)

		ev := newEvent("orders", "order-1", 1)
		requireAllPublished(t, publish(ctx, t, sink, []*ferryevent.Event{ev}), []*ferryevent.Event{ev})
		require.NoError(t, sink.Close(ctx), "first Close")
		require.NoError(t, sink.Close(ctx), "second Close must be a no-op")
		require.Len(t, readAll(ctx, t, read), 1, "an acknowledged event must stay stored after Close")
	})
}

func testPublishEmpty(t *testing.T, h Harness) {
	t.Parallel()
	ctx := testContext(t)
	sink, _ := newSink(t, h)

	require.Empty(t, sink.Publish(ctx, nil), "Publish(nil) must return no results")
	require.Empty(t, sink.Publish(ctx, []*ferryevent.Event{}), "Publish of an empty slice must return no results")
}

func testRoundTrip(t *testing.T, h Harness) {
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)

	// 4 calls of 50 keys: 200 events, each key once per call as the
	// relay does, with Seq counting the calls.
	const calls, keys = 4, 50
	var sent []*ferryevent.Event
	for c := range calls {
		batch := make([]*ferryevent.Event, 0, keys)
		for k := range keys {
			batch = append(batch, variedEvent(c*keys+k, roundTripKey(k), int64(c+1)))
		}
		requireAllPublished(t, publish(ctx, t, sink, batch), batch)
		sent = append(sent, batch...)
	}

	byID := storedByID(t, readAll(ctx, t, read))
	require.Len(t, byID, len(sent), "the destination must hold exactly the published events")
	for _, want := range sent {
		got, ok := byID[want.ID]
		require.True(t, ok, "event %s (key %q) was acknowledged but is not stored", want.ID, want.Key)
		ferryeventtest.RequireSame(t, want, got)
	}
}

func testCodecsRoundTrip(t *testing.T, h Harness) {
	t.Parallel()
	testCodecs(t, h)
}

func testEdgeCases(t *testing.T, h Harness) {
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)

	// Ferry's rule: an event Validate accepts (with the limit the
	// destination declares) arrives exactly; the others are refused
	// before they reach a sink.
	limit := h.Features.MaxPayloadBytes
	accepted := ferryeventtest.Prepare(t, ferryeventtest.Cases(limit), limit)
	for i, err := range publish(ctx, t, sink, accepted) {
		require.NoError(t, err, "event %d (key %.60q) was accepted at emit, so the sink must carry it", i, accepted[i].Key)
	}
	byID := storedByID(t, readAll(ctx, t, read))
	require.Len(t, byID, len(accepted), "the destination must hold exactly the published events")
	for _, want := range accepted {
		ferryeventtest.RequireSame(t, want, byID[want.ID])
	}
}

func testPerKeyOrderAcrossCalls(t *testing.T, h Harness) {
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)

	const calls, keys = 50, 20
	want := make(map[string][]uuid.UUID, keys)
	for c := range calls {
		batch := make([]*ferryevent.Event, 0, keys)
		for k := range keys {
			ev := newEvent("orders", "order-"+strconv.Itoa(k), int64(c+1))
			batch = append(batch, ev)
			want[ev.Key] = append(want[ev.Key], ev.ID)
		}
		requireAllPublished(t, publish(ctx, t, sink, batch), batch)
	}

	stored := readAll(ctx, t, read)
	require.Len(t, stored, calls*keys)
	requirePerKeyOrder(t, stored, want)
}

func testConcurrentPublishers(t *testing.T, h Harness) {
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)

	// 8 publishers on distinct key sets, 25 calls of 25 keys each:
	// 5,000 events. Failures are collected and checked on the test
	// goroutine, where require may stop the test.
	const publishers, calls, keys = 8, 25, 25
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []string
		want     = make(map[string][]uuid.UUID, publishers*keys)
	)
	for p := range publishers {
		wg.Go(func() {
			for c := range calls {
				batch := make([]*ferryevent.Event, 0, keys)
				for k := range keys {
					batch = append(batch, newEvent("payments", fmt.Sprintf("p%d-account-%d", p, k), int64(c+1)))
				}
				errs := sink.Publish(ctx, batch)
				mu.Lock()
				if len(errs) != len(batch) {
					failures = append(failures, fmt.Sprintf("publisher %d call %d: %d results for %d events", p, c, len(errs), len(batch)))
				}
				for i, err := range errs {
					if err != nil {
						failures = append(failures, fmt.Sprintf("publisher %d call %d event %d: %v", p, c, i, err))
					}
				}
				for _, ev := range batch {
					want[ev.Key] = append(want[ev.Key], ev.ID)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Empty(t, failures, "every concurrent publish must succeed")

	stored := readAll(ctx, t, read)
	require.Len(t, stored, publishers*calls*keys, "events were lost or duplicated")
	requirePerKeyOrder(t, stored, want)
}

func testBrokerDedup(t *testing.T, h Harness) {
	if !h.Features.BrokerDedup {
		t.Log("the harness does not declare Features.BrokerDedup: the destination keeps duplicates, consumers deduplicate")
		return
	}
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)

	ev := newEvent("orders", "order-1", 1)
	requireAllPublished(t, publish(ctx, t, sink, []*ferryevent.Event{ev}), []*ferryevent.Event{ev})
	// The relay republishes an event whose first outcome it did not
	// learn; the copy has the same ID and must be acknowledged.
	again := cloneEvent(ev)
	other := newEvent("orders", "order-2", 1)
	batch := []*ferryevent.Event{again, other}
	requireAllPublished(t, publish(ctx, t, sink, batch), batch)

	stored := readAll(ctx, t, read)
	require.Len(t, stored, 2, "the second publish of event %s must be dropped by the destination", ev.ID)
	byID := storedByID(t, stored)
	ferryeventtest.RequireSame(t, ev, byID[ev.ID])
	ferryeventtest.RequireSame(t, other, byID[other.ID])
}

func testEachReportsEveryOutcome(t *testing.T, h Harness) {
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)
	ep, ok := sink.(ferrysink.EachPublisher)
	if !ok {
		t.Log("the sink does not implement ferrysink.EachPublisher: the relay learns outcomes when a call returns")
		return
	}
	// Calls of distinct keys run at once, as the relay runs them; one
	// event per call is refused for good where the destination can
	// tell, so that failures are reported too.
	const calls, keys = 4, 25
	type outcome struct {
		batch    []*ferryevent.Event
		big      bool
		errs     []error
		reported []int
		got      []error
	}
	outcomes := make([]*outcome, calls)
	var wg sync.WaitGroup
	for c := range calls {
		o := &outcome{}
		outcomes[c] = o
		for k := range keys {
			o.batch = append(o.batch, newEvent("orders", fmt.Sprintf("each-%d-%d", c, k), 1))
		}
		if h.Features.MaxPayloadBytes > 0 {
			big := newEvent("orders", fmt.Sprintf("each-big-%d", c), 1)
			big.Payload = bytes.Repeat([]byte{'x'}, h.Features.MaxPayloadBytes+1)
			o.batch, o.big = append(o.batch, big), true
		}
		o.reported, o.got = make([]int, len(o.batch)), make([]error, len(o.batch))
		wg.Go(func() {
			var mu sync.Mutex
			errs := ep.PublishEach(ctx, o.batch, func(i int, err error) {
				mu.Lock()
				defer mu.Unlock()
				o.reported[i]++
				o.got[i] = err
			})
			mu.Lock()
			defer mu.Unlock()
			o.errs = errs
		})
	}
	wg.Wait()
	var sent []*ferryevent.Event
	for _, o := range outcomes {
		require.Len(t, o.errs, len(o.batch))
		for i := range o.batch {
			require.Equal(t, 1, o.reported[i], "event %d: done must be called exactly once, before PublishEach returns", i)
			require.Equal(t, o.errs[i], o.got[i], "event %d: done must report the error PublishEach returns", i)
		}
		small := o.batch
		if o.big {
			requirePermanent(t, o.errs[len(o.errs)-1], "an event over MaxPayloadBytes")
			small = o.batch[:len(o.batch)-1]
		}
		requireAllPublished(t, o.errs[:len(small)], small)
		sent = append(sent, small...)
	}
	byID := storedByID(t, readAll(ctx, t, read))
	require.Len(t, byID, len(sent), "the destination must hold exactly the acknowledged events")
}

// relayLike publishes each key's queue in order the way the relay does:
// one event per key per call (or whole queues to an OrderedBatcher), the
// failed ones again after a pause, never an event before its key's
// previous one was acknowledged. It returns the number of failures and the
// first.
func relayLike(ctx context.Context, t *testing.T, sink ferrysink.Sink, queues [][]*ferryevent.Event, published *atomic.Int64) (int, error) {
	t.Helper()
	ob, ordered := sink.(ferrysink.OrderedBatcher)
	ordered = ordered && ob.OrderedBatches()
	next := make([]int, len(queues))
	failures := 0
	var firstErr error
	for {
		var batch []*ferryevent.Event
		var owner []int
		for k, q := range queues {
			end := min(next[k]+1, len(q))
			if ordered {
				end = min(next[k]+25, len(q))
			}
			for _, ev := range q[next[k]:end] {
				batch = append(batch, ev)
				owner = append(owner, k)
			}
		}
		if len(batch) == 0 {
			return failures, firstErr
		}
		require.NoError(t, ctx.Err(), "the events were not all published in time (%d failures so far)", failures)
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		errs := publish(callCtx, t, sink, batch)
		cancel()
		failed := make(map[int]bool)
		for i, err := range errs {
			k := owner[i]
			switch {
			case err == nil && !failed[k]:
				next[k]++
				published.Add(1)
			case err == nil:
				t.Fatalf("key %q: event %s acknowledged after an earlier event of its key failed in the same call", batch[i].Key, batch[i].ID)
			default:
				require.False(t, ferrysink.IsPermanent(err), "a transient fault must not be reported as permanent: %v", err)
				failed[k] = true
				failures++
				if firstErr == nil {
					firstErr = err
				}
			}
		}
		if len(failed) > 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// requireInOrderAtLeastOnce checks that stored holds every event of want,
// each key's first copies in publish order. With strict, any repeated copy
// (a retry whose first attempt did land) must come before the next event
// of its key: all a sink given one event per key per call can produce. A
// sink given whole batches (ferrysink.OrderedBatcher) can also store a
// failed batch's head twice, the retry after the first attempt's copies:
// later copies of earlier events, which consumers drop by event ID.
func requireInOrderAtLeastOnce(t *testing.T, stored []Stored, want map[string][]uuid.UUID, strict bool) {
	t.Helper()
	got := make(map[string][]uuid.UUID, len(want))
	seen := make(map[uuid.UUID]bool)
	dups := 0
	for _, s := range stored {
		ev := s.Event
		ids := got[ev.Key]
		if seen[ev.ID] {
			dups++
			if strict {
				require.Equal(t, ids[len(ids)-1], ev.ID, "key %q: a repeated copy of %s is stored after a later event of its key", ev.Key, ev.ID)
			}
			continue
		}
		seen[ev.ID] = true
		got[ev.Key] = append(ids, ev.ID)
	}
	for key, ids := range want {
		require.Equal(t, ids, got[key], "key %q: events lost or out of order", key)
	}
	t.Logf("%d stored, %d repeated copies", len(stored), dups)
}

// newSink builds a sink through the harness and closes it when the test
// ends. Sinks must tolerate that extra Close after the test's own.
func newSink(t *testing.T, h Harness) (ferrysink.Sink, ReadFunc) {
	t.Helper()
	sink, read := h.New(t)
	require.NotNil(t, sink, "Harness.New returned a nil sink")
	require.NotNil(t, read, "Harness.New returned a nil ReadFunc")
	t.Cleanup(func() {
		// t.Context is already done when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		require.NoError(t, sink.Close(ctx), "Close at the end of the test")
	})
	return sink, read
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// publish calls Publish and checks the one rule every call obeys: one
// result per event.
func publish(ctx context.Context, t *testing.T, sink ferrysink.Sink, events []*ferryevent.Event) []error {
	t.Helper()
	errs := sink.Publish(ctx, events)
	require.Len(t, errs, len(events), "Publish must return exactly one result per event")
	return errs
}

// publishPromptly runs Publish, whose context is done or about to be, and
// fails the test if it does not return within promptReturn.
func publishPromptly(ctx context.Context, t *testing.T, sink ferrysink.Sink, events []*ferryevent.Event) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() { done <- sink.Publish(ctx, events) }()
	timer := time.NewTimer(promptReturn)
	defer timer.Stop()
	select {
	case errs := <-done:
		require.Len(t, errs, len(events), "Publish must return exactly one result per event")
		return errs
	case <-timer.C:
		t.Fatalf("Publish did not return within %s of its context being cancelled", promptReturn)
		return nil
	}
}

func requireAllPublished(t *testing.T, errs []error, events []*ferryevent.Event) {
	t.Helper()
	for i, err := range errs {
		require.NoError(t, err, "publish event %d (%s, key %q)", i, events[i].ID, events[i].Key)
	}
}

func requirePermanent(t *testing.T, err error, what string) {
	t.Helper()
	require.Error(t, err, "%s must fail", what)
	require.True(t, ferrysink.IsPermanent(err), "%s must fail with a ferrysink.PermanentError, got %T: %v", what, err, err)
	var pe *ferrysink.PermanentError
	require.ErrorAs(t, err, &pe)
	require.NotEmpty(t, pe.Reason, "%s: the PermanentError needs a Reason, stored with the dead letter", what)
}

func readAll(ctx context.Context, t *testing.T, read ReadFunc) []Stored {
	t.Helper()
	stored, err := read(ctx)
	require.NoError(t, err, "read back the destination")
	return stored
}

// storedByID indexes stored events by ID and fails on a duplicate: the
// suite never retries, so a duplicate means the sink published twice.
func storedByID(t *testing.T, stored []Stored) map[uuid.UUID]*ferryevent.Event {
	t.Helper()
	byID := make(map[uuid.UUID]*ferryevent.Event, len(stored))
	for i := range stored {
		ev := &stored[i].Event
		_, dup := byID[ev.ID]
		require.False(t, dup, "event %s is stored twice", ev.ID)
		byID[ev.ID] = ev
	}
	return byID
}

// requirePerKeyOrder checks that stored holds, for each key, exactly the
// IDs in want, in that order, with Seq counting from 1.
func requirePerKeyOrder(t *testing.T, stored []Stored, want map[string][]uuid.UUID) {
	t.Helper()
	got := make(map[string][]uuid.UUID, len(want))
	for _, s := range stored {
		ev := s.Event
		require.Equal(t, int64(len(got[ev.Key])+1), ev.Seq, "key %q: event %s is stored out of order", ev.Key, ev.ID)
		got[ev.Key] = append(got[ev.Key], ev.ID)
	}
	require.Len(t, got, len(want), "stored keys")
	for key, ids := range want {
		require.Equal(t, ids, got[key], "key %q: stored order differs from publish order", key)
	}
}

// baseTime anchors CreatedAt values. It has microsecond precision, what
// every outbox store keeps, and a non-UTC zone, which must not matter.
var baseTime = time.Date(2025, 3, 30, 1, 59, 58, 123456000, time.FixedZone("UTC+5:30", 5*3600+1800))

// newEvent builds a plain, valid event.
func newEvent(topic, key string, seq int64) *ferryevent.Event {
	ev := &ferryevent.Event{
		ID:          ferryevent.NewID(),
		Topic:       topic,
		Key:         key,
		Type:        "OrderPlaced",
		Source:      "ferrysinktest",
		ContentType: "application/json",
		Payload:     fmt.Appendf(nil, `{"key":%q,"seq":%d}`, key, seq),
		CreatedAt:   time.Now().Truncate(time.Microsecond),
		Seq:         seq,
	}
	mustPrepare(ev)
	return ev
}

// roundTripKey varies keys: plain, non-ASCII, with spaces and punctuation.
func roundTripKey(k int) string {
	switch k % 5 {
	case 1:
		return "клиент-" + strconv.Itoa(k)
	case 2:
		return "customer " + strconv.Itoa(k) + "/ü:€"
	default:
		return "customer-" + strconv.Itoa(k)
	}
}

// variedEvent builds the n-th event of the round-trip test, cycling
// through the shapes a sink must carry intact.
func variedEvent(n int, key string, seq int64) *ferryevent.Event {
	rng := rand.New(rand.NewPCG(uint64(n), 0x5eed))
	ev := &ferryevent.Event{
		ID:        ferryevent.NewID(),
		Topic:     []string{"orders", "payments.v2", "audit_log"}[n%3],
		Key:       key,
		Type:      []string{"OrderPlaced", "PaymentCaptured", "com.example.order.shipped.v1", "Ünïcode✓"}[n%4],
		Source:    []string{"ferrysinktest/orders", "", "urn:service:billing"}[n%3],
		CreatedAt: baseTime.Add(time.Duration(n) * 1001 * time.Microsecond),
		Seq:       seq,
	}
	switch n % 4 {
	case 1:
		ev.Headers = map[string]string{
			"traceparent":      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"x-correlation-id": uuid.NewString(),
		}
	case 2:
		ev.Headers = map[string]string{"X-Tenant": "acme ünïcode ✓ \"quoted\", a=b; c"}
	case 3:
		ev.Headers = make(map[string]string, 12)
		for i := range 12 {
			ev.Headers["x-header-"+strconv.Itoa(i)] = strconv.Itoa(rng.IntN(1 << 30))
		}
	}
	switch n % 6 {
	case 0:
		ev.ContentType = "application/json"
		ev.Payload = fmt.Appendf(nil, `{"n":%d,"key":%q,"note":"ünïcode ✓"}`, n, key)
	case 1:
		ev.ContentType = "application/octet-stream"
		ev.Payload = make([]byte, 256) // every byte value, NUL and CR LF included
		for i := range ev.Payload {
			ev.Payload[i] = byte(i)
		}
	case 2:
		ev.Payload = nil
	case 3:
		ev.ContentType = "application/json"
		ev.Payload = []byte{}
	case 4:
		ev.ContentType = "application/protobuf"
		ev.Payload = make([]byte, 64<<10)
		for i := range ev.Payload {
			ev.Payload[i] = byte(rng.Uint32())
		}
	case 5:
		ev.ContentType = "text/plain; charset=utf-8"
		ev.Payload = []byte("line one\r\nline two\n\x00trailing NUL")
	}
	mustPrepare(ev)
	return ev
}

func cloneEvent(ev *ferryevent.Event) *ferryevent.Event {
	c := *ev
	c.Headers = maps.Clone(ev.Headers)
	c.Payload = bytes.Clone(ev.Payload)
	return &c
}

// mustPrepare validates a suite event the way Ferry does before storing it,
// so that the suite never sends what the relay never would.
func mustPrepare(ev *ferryevent.Event) {
	if err := ferryevent.Prepare(ev, 0, math.MaxInt, time.Now()); err != nil {
		panic(errors.Join(errors.New("ferrysinktest: built an invalid event"), err))
	}
}
