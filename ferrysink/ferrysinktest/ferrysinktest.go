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
	"fmt"
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
