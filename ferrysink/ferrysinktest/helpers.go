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
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// The helpers the suite's parts share: sinks and contexts per test,
// publishing, reading back, the order and outcome checks, and the events.

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
