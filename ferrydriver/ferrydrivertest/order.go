package ferrydrivertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryevent/ferryeventtest"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func testAppendRoundTrip[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	ev := Event("orders", "order-1", "")
	ev.Source = "shop"
	ev.ContentType = "application/octet-stream"
	ev.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x": "y"}
	ev.Payload = []byte{0, 1, 2, 0xff, 'a'}
	ev.CreatedAt = time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	empty := Event("orders", "order-2", "")
	empty.Payload = nil
	emit(ctx, t, h, drv, ev, empty)
	require.NoError(t, drv.Append(ctx, []*ferryevent.Event{Event("orders", "order-1", "own-tx")}))

	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 3)
	require.Len(t, got, 3)
	g := got[0]
	require.Equal(t, ev.ID, g.ID)
	require.Equal(t, "orders", g.Topic)
	require.Equal(t, "order-1", g.Key)
	require.Equal(t, "Tested", g.Type)
	require.Equal(t, "shop", g.Source)
	require.Equal(t, "application/octet-stream", g.ContentType)
	require.Equal(t, ev.Headers, g.Headers)
	require.Equal(t, ev.Payload, g.Payload)
	require.True(t, ev.CreatedAt.Equal(g.CreatedAt), "created_at %v, want %v", g.CreatedAt, ev.CreatedAt)
	require.EqualValues(t, 1, g.Seq)
	require.Empty(t, got[1].Payload)
	require.EqualValues(t, 1, got[1].Seq)
	require.Equal(t, "own-tx", string(got[2].Payload))
	require.EqualValues(t, 2, got[2].Seq, "the second event of order-1 has Seq 2")
}

// testOutboxEdgeCases: every edge-case event Emit accepts is stored and
// read back by the feed exactly (ferryeventtest).
func testOutboxEdgeCases[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	drv := h.New(t)
	accepted := ferryeventtest.Prepare(t, ferryeventtest.Cases(0), 0)
	emit(ctx, t, h, drv, accepted...)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, len(accepted))
	require.Len(t, got, len(accepted))
	byID := make(map[uuid.UUID]*ferryevent.Event, len(got))
	for _, ev := range got {
		byID[ev.ID] = ev
	}
	for _, want := range accepted {
		ferryeventtest.RequireSame(t, want, byID[want.ID])
	}
}

func testRolledBack[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	tx := h.Begin(ctx, t, drv)
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, []*ferryevent.Event{Event("t", "k", "rolled back")}))
	require.NoError(t, tx.Rollback())
	after := Event("t", "k", "committed")
	emit(ctx, t, h, drv, after)
	got := OpenReader(ctx, t, drv, nil).ReadQuiet(ctx)
	require.Equal(t, []string{after.ID.String()}, ids(got))
	require.EqualValues(t, 1, got[0].Seq, "a rolled-back event must not use up a key sequence number")
}

func testSameKeyOneTx[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	var evs []*ferryevent.Event
	for i := range 200 {
		evs = append(evs, Event("t", "k"+strconv.Itoa(i%3), strconv.Itoa(i)))
	}
	emit(ctx, t, h, drv, evs...)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 200)
	seqs := map[string]int64{}
	perKey := map[string][]string{}
	for _, e := range got {
		seqs[e.Key]++
		require.Equal(t, seqs[e.Key], e.Seq, "key %s", e.Key)
		perKey[e.Key] = append(perKey[e.Key], string(e.Payload))
	}
	for k, payloads := range perKey {
		var want []string
		for i := range 200 {
			if "k"+strconv.Itoa(i%3) == k {
				want = append(want, strconv.Itoa(i))
			}
		}
		require.Equal(t, want, payloads, "key %s must be delivered in emit order", k)
	}
}

func requireConcurrent[TTx any](t *testing.T, h Harness[TTx], drv ferrydriver.Store) bool {
	if !drv.Capabilities().ConcurrentWriters {
		t.Logf("%s has a single writer: concurrent-transaction orderings cannot occur; checked by the sequential tests", drv.Name())
		return false
	}
	return true
}

// A transaction that takes its id first and commits last must be delivered.
func testLateCommitter[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	r := OpenReader(ctx, t, drv, nil)
	late := h.Begin(ctx, t, drv)
	require.NotNil(t, late.TakeXID, "harness must provide TakeXID for a concurrent-writer backend")
	require.NoError(t, late.TakeXID())
	lateEv := Event("t", "late", "late")
	require.NoError(t, drv.AppendTx(ctx, late.Tx, []*ferryevent.Event{lateEv}))
	var early []*ferryevent.Event
	for i := range 20 {
		ev := Event("t", "early-"+strconv.Itoa(i), "early")
		early = append(early, ev)
		emit(ctx, t, h, drv, ev)
	}
	got := r.ReadN(ctx, 20)
	require.ElementsMatch(t, ids(early), ids(got))
	require.NoError(t, late.Commit())
	got = r.ReadN(ctx, 1)
	require.Equal(t, []string{lateEv.ID.String()}, ids(got), "the late committer's event must be delivered, not skipped")
	require.Empty(t, r.ReadQuiet(ctx))
}

// T2 takes its transaction id before T1; T1 emits for K and commits first;
// then T2 emits for K and commits. Delivery: T1's event, then T2's.
func testPerKeyCommitOrder[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	t2 := h.Begin(ctx, t, drv)
	require.NoError(t, t2.TakeXID())
	t1 := h.Begin(ctx, t, drv)
	require.NoError(t, t1.TakeXID())
	e1 := Event("t", "K", "from T1")
	require.NoError(t, drv.AppendTx(ctx, t1.Tx, []*ferryevent.Event{e1}))
	require.NoError(t, t1.Commit())
	e2 := Event("t", "K", "from T2")
	err := drv.AppendTx(ctx, t2.Tx, []*ferryevent.Event{e2})
	if err == nil {
		err = t2.Commit()
	}
	if err != nil && h.Retryable != nil && h.Retryable(err) {
		// T2's snapshot predates T1's write of K: it aborts, and its rerun
		// comes after T1.
		t.Logf("T2 aborted on the conflict with T1 (%v) and runs again", err)
		_ = t2.Rollback()
		emit(ctx, t, h, drv, e2)
		err = nil
	}
	require.NoError(t, err)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 2)
	require.Equal(t, ids([]*ferryevent.Event{e1, e2}), ids(got))
	require.EqualValues(t, []int64{1, 2}, []int64{got[0].Seq, got[1].Seq})
}

// T2 emits for K first; T1's emit for K must wait for T2 to end, so the
// commit order is T2, T1 and delivery follows it. Other keys do not wait.
func testSameKeyWritersSerialise[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	t2 := h.Begin(ctx, t, drv)
	e2 := Event("t", "K", "from T2")
	require.NoError(t, drv.AppendTx(ctx, t2.Tx, []*ferryevent.Event{e2}))

	other := Event("t", "other", "x")
	emit(ctx, t, h, drv, other) // another key does not wait for T2

	e1 := Event("t", "K", "from T1")
	if h.Retryable != nil {
		// Writers of one key abort instead of waiting: T1 fails while T2
		// holds K, and its rerun after T2's commit lands after T2.
		t1 := h.Begin(ctx, t, drv)
		err := drv.AppendTx(ctx, t1.Tx, []*ferryevent.Event{e1})
		if err == nil {
			err = t1.Commit()
		}
		require.Error(t, err, "T1 wrote K while T2 held it")
		require.True(t, h.Retryable(err), "T1's conflict must be retryable: %v", err)
		_ = t1.Rollback()
		require.NoError(t, t2.Commit())
		emit(ctx, t, h, drv, e1)
		got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 3)
		var k []string
		for _, e := range got {
			if e.Key == "K" {
				k = append(k, e.ID.String())
			}
		}
		require.Equal(t, ids([]*ferryevent.Event{e2, e1}), k)
		return
	}
	done := make(chan error, 1)
	go func() {
		t1 := h.Begin(ctx, t, drv)
		err := drv.AppendTx(ctx, t1.Tx, []*ferryevent.Event{e1})
		if err == nil {
			err = t1.Commit()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("T1's append for K finished (%v) while T2 still held K", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, t2.Commit())
	require.NoError(t, <-done)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, 3)
	var k []string
	for _, e := range got {
		if e.Key == "K" {
			k = append(k, e.ID.String())
		}
	}
	require.Equal(t, ids([]*ferryevent.Event{e2, e1}), k)
}

// A write transaction held open elsewhere must not delay delivery.
func testLongWriter[TTx any](t *testing.T, h Harness[TTx]) {
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	hold := h.LongWriterHold
	if hold == 0 {
		hold = 10 * time.Second
	}
	const poll = 500 * time.Millisecond
	ctx := ctxT(t, hold+60*time.Second)
	end := h.HoldWriter(ctx, t)
	heldUntil := time.Now().Add(hold)
	defer end()

	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "test/0"})
	require.NoError(t, err)
	defer f.Close()
	const n = 1000
	emitted := make(chan time.Time, 1)
	go func() {
		for i := 0; i < n; i += 50 {
			var evs []*ferryevent.Event
			for j := range 50 {
				evs = append(evs, Event("t", "k"+strconv.Itoa((i+j)%37), "x"))
			}
			if err := drv.Append(ctx, evs); err != nil {
				t.Error(err)
			}
		}
		emitted <- time.Now()
	}()
	got := 0
	var lastEmit time.Time
	for got < n {
		b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 500, Wait: poll})
		require.NoError(t, err)
		got += len(b.Events)
		select {
		case lastEmit = <-emitted:
		default:
		}
	}
	if lastEmit.IsZero() {
		lastEmit = <-emitted
	}
	deliveredAt := time.Now()
	require.True(t, deliveredAt.Before(heldUntil), "all %d events must be delivered while the long writer is still open (it ends at %v, delivery finished at %v)", n, heldUntil, deliveredAt)
	lag := deliveredAt.Sub(lastEmit)
	require.LessOrEqual(t, lag, 2*poll, "the last events arrived %v after their commit; the limit is 2 x the poll interval", lag)
	// Keep the writer open for the whole hold, as the scenario says.
	time.Sleep(time.Until(heldUntil))
}

// testOpenProducer: a producer transaction that appended to a key and
// stays open holds that key's writers, and no other's: an append of many
// other keys, around it in key order too, goes through while it is open.
func testOpenProducer[TTx any](t *testing.T, h Harness[TTx]) {
	drv := h.New(t)
	if !requireConcurrent(t, h, drv) {
		return
	}
	ctx := ctxT(t, 2*time.Minute)
	// Other keys exist already, so that the append below updates them.
	var keys []string
	for _, k := range []string{"a", "l", "m-a", "m-z", "n", "z"} {
		for i := range 4 {
			keys = append(keys, k+strconv.Itoa(i))
		}
	}
	var first []*ferryevent.Event
	for _, k := range append(keys, "m-held") {
		first = append(first, Event("t", k, "first"))
	}
	emit(ctx, t, h, drv, first...)
	open := h.Begin(ctx, t, drv)
	held := Event("t", "m-held", "held")
	require.NoError(t, drv.AppendTx(ctx, open.Tx, []*ferryevent.Event{held}))

	var others []*ferryevent.Event
	for _, k := range keys {
		others = append(others, Event("t", k, "second"))
	}
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, drv.Append(actx, others), "an append of other keys waits for an open producer of key m-held")
	require.NoError(t, open.Commit())
	want := append(append(first, others...), held)
	got := OpenReader(ctx, t, drv, nil).ReadN(ctx, len(want))
	require.Equal(t, ids(want), ids(sortByKeyOrder(want, got)))
}

// commitSpan is when, on a clock the writers share, a transaction's
// commit was asked for and when it returned: a transaction whose commit
// returned before another's was asked for committed first.
type commitSpan struct{ asked, returned int64 }

func testConcurrentProducers[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	drv := h.New(t)
	const writers, perWriter, keys = 8, 60, 11
	r := OpenReader(ctx, t, drv, nil)
	var mu sync.Mutex
	var clock atomic.Int64
	committed := map[string]commitSpan{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range perWriter {
				var evs []*ferryevent.Event
				for j := range 1 + rng.IntN(3) {
					evs = append(evs, Event("t", "k"+strconv.Itoa(rng.IntN(keys)), fmt.Sprintf("%d-%d-%d", w, i, j)))
				}
				rollback := rng.IntN(5) == 0
				takeXID := rng.IntN(3) == 0
				var err error
				var span commitSpan
				for attempt := 0; attempt < 100; attempt++ {
					tx := h.Begin(ctx, t, drv)
					if tx.TakeXID != nil && takeXID {
						if err = tx.TakeXID(); err != nil {
							_ = tx.Rollback()
							break
						}
					}
					if err = drv.AppendTx(ctx, tx.Tx, evs); err == nil {
						if rollback {
							err = tx.Rollback()
							break
						}
						span.asked = clock.Add(1)
						err = tx.Commit()
						span.returned = clock.Add(1)
					} else {
						_ = tx.Rollback()
					}
					if err == nil || h.Retryable == nil || !h.Retryable(err) {
						break
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				if rollback {
					continue
				}
				mu.Lock()
				for _, e := range evs {
					committed[e.ID.String()] = span
				}
				mu.Unlock()
			}
		}()
	}
	var got []*ferryevent.Event
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		b, err := r.Read(ctx, &ferrydriver.ReadParams{Max: 37, Wait: 10 * time.Millisecond})
		require.NoError(t, err)
		got = append(got, b.Events...)
		select {
		case <-done:
			got = append(got, r.ReadQuiet(ctx)...)
			goto check
		default:
		}
	}
check:
	seen := map[string]bool{}
	lastSeq := map[string]int64{}
	byKey := map[string][]*ferryevent.Event{}
	for _, e := range got {
		require.False(t, seen[e.ID.String()], "event %s delivered twice", e.ID)
		seen[e.ID.String()] = true
		_, ok := committed[e.ID.String()]
		require.True(t, ok, "event %s was not committed", e.ID)
		// Commit order, witnessed by the writers: no event of a key comes
		// after one whose transaction's commit was asked for only once the
		// first's had returned.
		for _, before := range byKey[e.Key] {
			if committed[e.ID.String()].returned >= committed[before.ID.String()].asked {
				continue
			}
			require.Failf(t, "a key's events out of commit order", "key %s: %s (payload %s) committed before %s (payload %s) but was delivered after it",
				e.Key, e.ID, e.Payload, before.ID, before.Payload)
		}
		byKey[e.Key] = append(byKey[e.Key], e)
		if lastSeq[e.Key]+1 != e.Seq {
			for _, x := range got {
				if x.Key == e.Key {
					t.Logf("%s seq=%d id=%s payload=%s", x.Key, x.Seq, x.ID, x.Payload)
				}
			}
		}
		require.Equal(t, lastSeq[e.Key]+1, e.Seq, "key %s: seq must increase by one", e.Key)
		lastSeq[e.Key] = e.Seq
	}
	require.Len(t, seen, len(committed), "every committed event delivered")
}

func testResume[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	var all []*ferryevent.Event
	for i := range 30 {
		all = append(all, Event("t", "k"+strconv.Itoa(i%4), strconv.Itoa(i)))
	}
	emit(ctx, t, h, drv, all[:10]...)
	r := OpenReader(ctx, t, drv, nil)
	b, err := r.Read(ctx, &ferrydriver.ReadParams{Max: 4, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Events, 4)
	cursor := b.Cursor
	// Events read after the saved cursor are "in flight" and get re-read.
	_, err = r.Read(ctx, &ferrydriver.ReadParams{Max: 3, Wait: time.Second})
	require.NoError(t, err)
	emit(ctx, t, h, drv, all[10:]...)

	r2 := OpenReader(ctx, t, drv, cursor)
	rest := r2.ReadQuiet(ctx)
	require.Equal(t, ids(all[4:]), ids(sortByKeyOrder(all[4:], rest)))
	// and a third reader from the end gets nothing
	require.Empty(t, OpenReader(ctx, t, drv, r2.Last).ReadQuiet(ctx))
}

// sortByKeyOrder checks rest holds exactly want's events with each key's
// order kept, and returns them in want's order.
func sortByKeyOrder(want, rest []*ferryevent.Event) []*ferryevent.Event {
	pos := map[string]int{}
	for i, e := range rest {
		pos[e.ID.String()] = i
	}
	out := make([]*ferryevent.Event, 0, len(rest))
	lastPos := map[string]int{}
	for _, e := range want {
		p, ok := pos[e.ID.String()]
		if !ok {
			return rest
		}
		if lp, ok := lastPos[e.Key]; ok && p < lp {
			return rest
		}
		lastPos[e.Key] = p
		out = append(out, rest[p])
	}
	if len(out) != len(rest) {
		return rest
	}
	return out
}

func testWakeUp[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	drv := h.New(t)
	if !drv.Capabilities().NotifyWakeups {
		t.Logf("%s has no wake-ups: the feed polls; checked by the other tests", drv.Name())
		return
	}
	r := OpenReader(ctx, t, drv, nil)
	require.Empty(t, r.ReadQuiet(ctx))
	// One event, then a batch of two (each append form wakes the feed).
	for _, n := range []int{1, 2} {
		got := make(chan *ferrydriver.Batch, 1)
		go func() {
			b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 30 * time.Second})
			if err != nil {
				t.Error(err)
			}
			got <- b
		}()
		time.Sleep(500 * time.Millisecond) // past the feed's busy spell: it waits for a wake-up
		var evs []*ferryevent.Event
		for i := range n {
			evs = append(evs, Event("t", "k", "wake "+strconv.Itoa(i)))
		}
		start := time.Now()
		emit(ctx, t, h, drv, evs...)
		select {
		case b := <-got:
			require.Equal(t, ids(evs), ids(b.Events))
		case <-time.After(10 * time.Second):
			t.Fatalf("a commit of %d events did not wake a feed waiting for 30 s", n)
		}
		t.Logf("%d events: woken %v after the commit started", n, time.Since(start))
	}
}
