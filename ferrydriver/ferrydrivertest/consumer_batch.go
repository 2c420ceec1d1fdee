package ferrydrivertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"strconv"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// testConsumerBatchHandler: a HandleEventBatch handler gets the batch's
// events of its type in one call (one each without batching); when the
// call fails, each event runs alone, so that only the failing one retries
// and goes DEAD, and the others are applied once, with one attempt.
func testConsumerBatchHandler[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, 2*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	batch := 1
	if h.batch > 1 {
		batch = 64
	}
	c := newConsumer(t, h, d, ferry.ConsumerConfig{Workers: 1, MaxAttempts: 2, BatchSize: batch})
	var calls, widest atomic.Int32
	c.HandleEventBatch("Tested", func(ctx context.Context, tx TTx, evs []*ferryevent.Event) error {
		calls.Add(1)
		for w := widest.Load(); int32(len(evs)) > w && !widest.CompareAndSwap(w, int32(len(evs))); w = widest.Load() {
		}
		for _, ev := range evs {
			if string(ev.Payload) == "bad" {
				return errors.New("bad event in the batch")
			}
			if err := record(ctx, tx, ev); err != nil {
				return err
			}
		}
		return nil
	})
	evs := make([]*ferryevent.Event, 50)
	for i := range evs {
		evs[i] = Event("t", fmt.Sprintf("k%02d", i), strconv.Itoa(i))
	}
	bad := evs[20]
	bad.Payload = []byte("bad")
	_, err := c.Ingest(ctx, evs)
	require.NoError(t, err)
	row := settle(ctx, t, d, run(c), counts, evs, bad.ID)[bad.ID]
	require.Equal(t, 2, row.Attempts)
	require.Contains(t, row.LastError, "bad event in the batch")
	if _, ok := d.(ferrydriver.InboxBatcher[TTx]); ok && h.batch > 1 {
		require.Equal(t, int32(50), widest.Load(), "one call for the whole batch")
	} else {
		require.Equal(t, int32(1), widest.Load(), "one event per call without batches")
	}
}

// testConsumerDeadlineInBatch: a handler that blocks until its deadline
// fails its whole transaction (in a batch, everyone's): its event counts
// the attempt and goes DEAD after MaxAttempts; the batch's other events
// run again at once, uncounted, and are applied once with one attempt.
func testConsumerDeadlineInBatch[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, 2*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	batch := 1
	if h.batch > 1 {
		batch = 16
	}
	c := newConsumer(t, h, d, ferry.ConsumerConfig{Workers: 1, MaxAttempts: 2, BatchSize: batch, ClaimTTL: time.Second})
	evs := make([]*ferryevent.Event, 16)
	for i := range evs {
		evs[i] = Event("t", fmt.Sprintf("k%02d", i), strconv.Itoa(i))
	}
	slow := evs[5]
	c.HandleAll(func(ctx context.Context, tx TTx, ev *ferryevent.Event) error {
		if ev.ID == slow.ID {
			<-ctx.Done() // until the claim's deadline
			return ctx.Err()
		}
		return record(ctx, tx, ev)
	})
	_, err := c.Ingest(ctx, evs)
	require.NoError(t, err)
	row := settle(ctx, t, d, run(c), counts, evs, slow.ID)[slow.ID] // the others: its failures cost them nothing
	require.Equal(t, 2, row.Attempts)
	require.Contains(t, row.LastError, context.DeadlineExceeded.Error())
}

// testConsumerSlowBatch: handlers of 200 ms in a batch of 32: the batch
// commits what ran after its time budget (a second) and gives the rest
// back, uncounted; every event is applied once, with one attempt, and no
// transaction holds more than a budget's worth of handlers.
func testConsumerSlowBatch[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, 2*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	c := newConsumer(t, h, d, ferry.ConsumerConfig{Workers: 1})
	var mu sync.Mutex
	inTx := map[any]int{} // handlers per transaction
	c.HandleAll(func(ctx context.Context, tx TTx, ev *ferryevent.Event) error {
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		inTx[any(tx)]++
		mu.Unlock()
		return record(ctx, tx, ev)
	})
	evs := make([]*ferryevent.Event, 12)
	for i := range evs {
		evs[i] = Event("t", fmt.Sprintf("k%02d", i), strconv.Itoa(i))
	}
	_, err := c.Ingest(ctx, evs)
	require.NoError(t, err)
	settle(ctx, t, d, run(c), counts, evs) // given back uncounted: one attempt each
	mu.Lock()
	defer mu.Unlock()
	for _, n := range inTx {
		require.LessOrEqual(t, n, 7, "a transaction ran %d handlers of 200 ms: past its one-second budget", n)
	}
}

// testConsumerRuns: a backlog of a few keys with many events each, so
// that a claim can take runs of a key's events (ClaimInboxParams.PerKey)
// and a batch several events of one key. An event that goes DEAD in the
// middle of its key's run stops the run: the key's earlier events are
// applied, its later ones run after it, in order (the group continues past
// DEAD events here), each once. With a batch handler, no call gets two
// events of one key.
func testConsumerRuns[TTx any](t *testing.T, h ConsumerHarness[TTx], batchHandler bool) {
	ctx := ctxT(t, 2*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	c := newConsumer(t, h, d, ferry.ConsumerConfig{Workers: 2, MaxAttempts: 2, DeadPolicy: ferry.Continue})
	const keys, perKey = 4, 24
	evs := make([]*ferryevent.Event, 0, keys*perKey)
	for i := range keys * perKey {
		ev := Event("Tested", fmt.Sprintf("k%d", i%keys), strconv.Itoa(i))
		ev.Seq = int64(i/keys + 1)
		evs = append(evs, ev)
	}
	poisoned := func(ev *ferryevent.Event) bool {
		return (ev.Key == "k0" && ev.Seq == 5) || (ev.Key == "k1" && ev.Seq == 17)
	}
	var dead []uuid.UUID
	for _, ev := range evs {
		if poisoned(ev) {
			dead = append(dead, ev.ID)
		}
	}
	var mu sync.Mutex
	order := map[string][]int64{} // what handlers applied, in order, once their call succeeded
	applied := func(evs ...*ferryevent.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			order[ev.Key] = append(order[ev.Key], ev.Seq)
		}
	}
	apply := func(ctx context.Context, tx TTx, ev *ferryevent.Event) error {
		if poisoned(ev) {
			return errors.New("poison")
		}
		return record(ctx, tx, ev)
	}
	if batchHandler {
		c.HandleEventBatch("Tested", func(ctx context.Context, tx TTx, evs []*ferryevent.Event) error {
			seen := map[string]bool{}
			for _, ev := range evs {
				if seen[ev.Key] {
					t.Errorf("a batch handler's call got two events of key %s", ev.Key)
				}
				seen[ev.Key] = true
			}
			for _, ev := range evs {
				if err := apply(ctx, tx, ev); err != nil {
					return err
				}
			}
			applied(evs...)
			return nil
		})
	} else {
		c.HandleAll(func(ctx context.Context, tx TTx, ev *ferryevent.Event) error {
			if err := apply(ctx, tx, ev); err != nil {
				return err
			}
			applied(ev)
			return nil
		})
	}
	_, err := c.Ingest(ctx, evs) // before Run: a backlog in every key
	require.NoError(t, err)
	settle(ctx, t, d, run(c), counts, evs, dead...)
	mu.Lock()
	defer mu.Unlock()
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		got := committedOrder(order[key])
		for i := 1; i < len(got); i++ {
			require.Less(t, got[i-1], got[i], "key %s applied out of order: %v", key, got)
		}
		want := perKey
		if key == "k0" || key == "k1" {
			want--
		}
		require.Len(t, got, want, "key %s: every event but the dead one applied (a batch handler's call that failed rolled back: %v)", key, got)
	}
}
