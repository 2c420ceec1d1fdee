package ferrysinktest

import (
	"bytes"
	"context"
	"errors"
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

func testFenceStopsHandOff(t *testing.T, h Harness) {
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)
	// The fence lets the first 5 hand-offs through, then refuses: as a
	// relay that lost its lease in the middle of a call.
	errFenced := errors.New("lease lost")
	var mu sync.Mutex
	passed := 0
	fctx := ferrysink.WithFence(ctx, func() error {
		mu.Lock()
		defer mu.Unlock()
		if passed >= 5 {
			return errFenced
		}
		passed++
		return nil
	})
	batch := make([]*ferryevent.Event, 20)
	for i := range batch {
		batch[i] = newEvent("orders", fmt.Sprintf("fence-%d", i), 1)
	}
	errs := publish(fctx, t, sink, batch)
	stored := storedByID(t, readAll(ctx, t, read))
	refused := 0
	for i, err := range errs {
		if err == nil {
			require.Contains(t, stored, batch[i].ID, "event %d was acknowledged", i)
			continue
		}
		refused++
		require.ErrorIs(t, err, errFenced, "event %d: a fenced event reports the fence's error", i)
		require.False(t, ferrysink.IsPermanent(err), "event %d: a fenced event is retried by the next leader, not dead-lettered", i)
		require.NotContains(t, stored, batch[i].ID, "event %d was handed over after the fence refused", i)
	}
	require.GreaterOrEqual(t, refused, len(batch)-5, "the sink must check the fence before each hand-off")
}

func testPayloadTooLarge(t *testing.T, h Harness) {
	if h.Features.MaxPayloadBytes <= 0 {
		t.Log("the harness does not declare Features.MaxPayloadBytes: the destination has no size limit to check")
		return
	}
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)

	before := newEvent("files", "file-1", 1)
	big := newEvent("files", "file-2", 1)
	big.Payload = bytes.Repeat([]byte{'x'}, h.Features.MaxPayloadBytes+1)
	after := newEvent("files", "file-3", 1)
	errs := publish(ctx, t, sink, []*ferryevent.Event{before, big, after})

	require.NoError(t, errs[0], "an event before the oversized one must still be published")
	requirePermanent(t, errs[1], "an event over MaxPayloadBytes")
	require.NoError(t, errs[2], "an event after the oversized one must still be published")
	byID := storedByID(t, readAll(ctx, t, read))
	require.Len(t, byID, 2, "only the two small events may be stored")
	ferryeventtest.RequireSame(t, before, byID[before.ID])
	ferryeventtest.RequireSame(t, after, byID[after.ID])
}

func testUnroutableTopic(t *testing.T, h Harness) {
	if h.Features.UnroutableTopic == "" {
		t.Log("the harness does not declare Features.UnroutableTopic: every topic routes")
		return
	}
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)

	routed := newEvent("orders", "order-1", 1)
	lost := newEvent(h.Features.UnroutableTopic, "order-2", 1)
	errs := publish(ctx, t, sink, []*ferryevent.Event{routed, lost})

	require.NoError(t, errs[0], "a routable event in the same call must still be published")
	requirePermanent(t, errs[1], "an event on the unroutable topic "+strconv.Quote(h.Features.UnroutableTopic))
	byID := storedByID(t, readAll(ctx, t, read))
	require.Len(t, byID, 1)
	ferryeventtest.RequireSame(t, routed, byID[routed.ID])
}

func testCancelledContext(t *testing.T, h Harness) {
	t.Parallel()
	sink, _ := newSink(t, h)

	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	batch := make([]*ferryevent.Event, 10)
	for i := range batch {
		batch[i] = newEvent("orders", "order-"+strconv.Itoa(i), 1)
	}
	errs := publishPromptly(ctx, t, sink, batch)
	for i, err := range errs {
		require.Error(t, err, "event %d: Publish with a cancelled context must not report success", i)
		require.False(t, ferrysink.IsPermanent(err), "event %d: a cancelled publish must be retryable, not permanent: %v", i, err)
	}
}

func testCancelDuringPublish(t *testing.T, h Harness) {
	t.Parallel()
	sink, read := newSink(t, h)

	ctx, cancel := context.WithCancel(testContext(t))
	batch := make([]*ferryevent.Event, 2000)
	for i := range batch {
		batch[i] = newEvent("orders", "order-"+strconv.Itoa(i), 1)
	}
	// Cancel as soon as the destination holds something, which is
	// the only signal a sink gives from outside. What must hold:
	// Publish returns promptly, and every event reported as published
	// is stored.
	cancelled := make(chan struct{})
	go func() {
		defer close(cancelled)
		defer cancel()
		for ctx.Err() == nil {
			if stored, err := read(ctx); err != nil || len(stored) > 0 {
				return
			}
		}
	}()
	errs := publishPromptly(ctx, t, sink, batch)
	cancel()
	<-cancelled

	byID := storedByID(t, readAll(testContext(t), t, read))
	for i, err := range errs {
		if err != nil {
			require.False(t, ferrysink.IsPermanent(err), "event %d: a cancelled publish must be retryable, not permanent: %v", i, err)
			continue
		}
		got, ok := byID[batch[i].ID]
		require.True(t, ok, "event %d was reported as published but is not stored", i)
		ferryeventtest.RequireSame(t, batch[i], got)
	}
}

func testCloseFlushesInFlight(t *testing.T, h Harness) {
	t.Parallel()
	ctx := testContext(t)
	sink, read := newSink(t, h)

	// Close while a call is in flight: every event the call reports
	// published must be stored (a buffering sink flushes before it
	// closes), and the call must return.
	batch := make([]*ferryevent.Event, 300)
	for i := range batch {
		batch[i] = newEvent("orders", "close-"+strconv.Itoa(i), 1)
	}
	done := make(chan []error, 1)
	go func() { done <- sink.Publish(ctx, batch) }()
	time.Sleep(2 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- sink.Close(ctx) }()
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(testTimeout / 2):
		t.Fatal("Publish did not return after Close")
	}
	require.Len(t, errs, len(batch))
	select {
	case err := <-closed:
		require.NoError(t, err, "Close with a call in flight")
	case <-time.After(testTimeout / 2):
		t.Fatal("Close did not return")
	}
	byID := storedByID(t, readAll(ctx, t, read))
	acked := 0
	for i, err := range errs {
		if err == nil {
			acked++
			ferryeventtest.RequireSame(t, batch[i], byID[batch[i].ID])
		}
	}
	t.Logf("%d of %d events acknowledged before Close", acked, len(batch))
	after := sink.Publish(ctx, []*ferryevent.Event{newEvent("orders", "after-close", 1)})
	require.Len(t, after, 1)
	require.Error(t, after[0], "Publish after Close must fail, not publish")
}

func testNoLossAcrossInterruptions(t *testing.T, h Harness) {
	if h.NewFaulty == nil {
		t.Fatal("Harness.NewFaulty is nil: give the suite a way to cut the sink's path to its destination (a tcpproxy outage, a broker restart), so that it can check nothing is lost across one")
	}
	t.Parallel()
	ctx := testContext(t)
	sink, read, interrupt := h.NewFaulty(t)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		require.NoError(t, sink.Close(cctx), "Close at the end of the test")
	})
	const keys, perKey, interruptions = 20, 40, 3
	want := make(map[string][]uuid.UUID, keys)
	queues := make([][]*ferryevent.Event, keys)
	for k := range keys {
		key := "faulty-" + strconv.Itoa(k)
		for s := range perKey {
			ev := newEvent("orders", key, int64(s+1))
			queues[k] = append(queues[k], ev)
			want[key] = append(want[key], ev.ID)
		}
	}
	var published atomic.Int64
	stop := make(chan struct{})
	faults := make(chan struct{})
	go func() {
		defer close(faults)
		for i := range interruptions {
			// Interrupt at about 1/4, 2/4 and 3/4 of the way.
			for published.Load() < int64((i+1)*keys*perKey/(interruptions+1)) {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
			interrupt()
		}
	}()
	failures, firstErr := relayLike(ctx, t, sink, queues, &published)
	close(stop)
	<-faults
	t.Logf("%d events over %d keys, %d interruptions: %d publish failures retried (first: %v)", keys*perKey, keys, interruptions, failures, firstErr)
	_, batched := sink.(ferrysink.OrderedBatcher)
	requireInOrderAtLeastOnce(t, readAll(ctx, t, read), want, !batched)
}
