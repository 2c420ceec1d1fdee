package ferrydrivertest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrytest"
	"github.com/stretchr/testify/require"
)

// exerciseFerrytest checks package ferrytest's helpers on the backend: the
// emitted-event assertions, and Drain into ferrytest.Sink.
func exerciseFerrytest[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("FerrytestAssertsWhatATransactionEmitted", func(t *testing.T) { t.Parallel(); testFerrytestEmitted(t, h) })
	t.Run("FerrytestDrainPublishesTheOutbox", func(t *testing.T) { t.Parallel(); testFerrytestDrain(t, h) })
}

type order struct {
	Total int `json:"total"`
}

func testFerrytestEmitted[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, time.Minute)
	drv := h.New(t)
	r := drv.(ferrydriver.OutboxReader[TTx])
	paid := Event("orders", "o-1", `{"total":12}`)
	paid.Type = "OrderPaid"
	second := Event("orders", "o-1", `{"total":5}`)
	second.Type = "OrderPaid"
	total := func(n int) ferrytest.Match {
		return ferrytest.Match{Type: "OrderPaid", Payload: ferrytest.PayloadJSON(func(o order) bool { return o.Total == n })}
	}

	tx := h.Begin(ctx, t, drv)
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, []*ferryevent.Event{paid, second}))
	got := ferrytest.RequireEmittedTx(t, r, tx.Tx, ferrytest.Match{Topic: "orders", Key: "o-1", Type: "OrderPaid", Count: 2})
	require.Equal(t, []string{paid.ID.String(), second.ID.String()}, ids(got))
	got = ferrytest.RequireEmittedTx(t, r, tx.Tx, total(12))
	require.Equal(t, []string{paid.ID.String()}, ids(got))
	ferrytest.RequireNotEmittedTx(t, r, tx.Tx, ferrytest.Match{Type: "OrderCancelled"})
	ferrytest.RequireNotEmitted(t, r, ferrytest.Match{Type: "OrderPaid"}) // not committed yet

	// Each assertion fails when it should, and says what it found.
	msg := fails(t, func(tb testing.TB) { ferrytest.RequireEmittedTx(tb, r, tx.Tx, total(99)) })
	require.Contains(t, msg, "fail the payload predicate")
	require.Contains(t, msg, paid.ID.String())
	msg = fails(t, func(tb testing.TB) { ferrytest.RequireEmittedTx(tb, r, tx.Tx, ferrytest.Match{Type: "OrderShipped"}) })
	require.Contains(t, msg, `holds no event matching type "OrderShipped"`)
	msg = fails(t, func(tb testing.TB) {
		ferrytest.RequireEmittedTx(tb, r, tx.Tx, ferrytest.Match{Key: "o-1", Count: 3})
	})
	require.Contains(t, msg, "holds 2 event(s) matching key \"o-1\", want 3")
	msg = fails(t, func(tb testing.TB) { ferrytest.RequireNotEmittedTx(tb, r, tx.Tx, total(5)) })
	require.Contains(t, msg, "want none")
	require.Contains(t, msg, second.ID.String())
	fails(t, func(tb testing.TB) { ferrytest.RequireEmitted(tb, r, ferrytest.Match{Type: "OrderPaid"}) })

	require.NoError(t, tx.Commit())
	ferrytest.RequireEmitted(t, r, ferrytest.Match{Key: "o-1", Count: 2})
	fails(t, func(tb testing.TB) { ferrytest.RequireNotEmitted(tb, r, total(12)) })

	rolled := Event("orders", "o-2", `{"total":7}`)
	rolled.Type = "OrderPaid"
	tx = h.Begin(ctx, t, drv)
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, []*ferryevent.Event{rolled}))
	ferrytest.RequireEmittedTx(t, r, tx.Tx, ferrytest.Match{Key: "o-2"})
	require.NoError(t, tx.Rollback())
	ferrytest.RequireNotEmitted(t, r, ferrytest.Match{Key: "o-2"})
}

func testFerrytestDrain[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 2*time.Minute)
	drv := h.New(t)
	var first []*ferryevent.Event
	for i := range 30 {
		first = append(first, Event("orders", fmt.Sprintf("k-%d", i%3), fmt.Sprintf(`{"n":%d}`, i)))
	}
	bad := Event("orders", "k-bad", `{}`)
	emit(ctx, t, h, drv, first[:10]...)
	emit(ctx, t, h, drv, append(first[10:], bad)...)

	sink := &ferrytest.Sink{Refuse: func(ev *ferryevent.Event) error {
		if ev.Key == "k-bad" {
			return ferrysink.Permanent("refused by the test", errors.New("no"))
		}
		return nil
	}}
	ferrytest.Drain(t, drv, sink, nil)
	require.ElementsMatch(t, ids(first), ids(sink.Events()), "every committed event published once, the refused one dead-lettered")
	requireKeyOrder(t, sink.Events())
	dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, bad.ID, dls[0].Event.ID)

	sink.Reset()
	more := []*ferryevent.Event{Event("orders", "k-0", `{"n":30}`), Event("orders", "k-4", `{"n":31}`)}
	emit(ctx, t, h, drv, more...)
	ferrytest.Drain(t, drv, sink, nil)
	require.Equal(t, ids(more), ids(sink.Events()), "a second Drain publishes what came after the first")
}

// requireKeyOrder checks that each key's events arrived in Seq order.
func requireKeyOrder(t *testing.T, evs []*ferryevent.Event) {
	t.Helper()
	last := map[string]int64{}
	for _, ev := range evs {
		require.Greater(t, ev.Seq, last[ev.Key], "key %s out of order", ev.Key)
		last[ev.Key] = ev.Seq
	}
}

// fails runs fn with a testing.TB that records a failure instead of
// failing t, requires that fn failed, and returns the failure's message.
func fails(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	r := &failRecorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); fn(r) }()
	<-done
	require.True(t, r.failed, "the assertion passed where it should have failed")
	return r.msg
}

type failRecorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *failRecorder) Helper() {}

func (r *failRecorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *failRecorder) Errorf(format string, args ...any) {
	r.failed, r.msg = true, strings.TrimSpace(r.msg+"\n"+fmt.Sprintf(format, args...))
}

func testFerrytestConsumer[TTx any](t *testing.T, h ConsumerHarness[TTx]) {
	ctx := ctxT(t, 2*time.Minute)
	d := h.New(t)
	record, counts := h.Effects(t, d)
	// A retry long after the first attempt's outcome is read.
	c := newConsumer(t, h, d, ferry.ConsumerConfig{MaxAttempts: 2, RetryBase: 500 * time.Millisecond, RetryMax: 500 * time.Millisecond})
	c.HandleAll(func(ctx context.Context, tx TTx, ev *ferry.Event) error {
		if err := record(ctx, tx, ev); err != nil {
			return err
		}
		if string(ev.Payload) == "fail" {
			return errors.New("the handler refused it")
		}
		return nil
	})
	consumer := ferrytest.NewConsumer(t, c, d)

	ok := &ferryevent.Event{Topic: "orders", Key: "o-1", Type: "OrderPaid", Payload: []byte("ok")}
	got := consumer.Deliver(ok)
	require.Equal(t, ferrytest.Delivery{State: ferrydriver.InboxProcessed, Attempts: 1}, got)
	again := *ok
	got = consumer.Deliver(&again)
	require.Equal(t, ferrytest.Delivery{Duplicate: true, State: ferrydriver.InboxProcessed, Attempts: 1}, got, "a second delivery of an ID runs nothing")

	bad := &ferryevent.Event{Topic: "orders", Key: "o-2", Type: "OrderPaid", Payload: []byte("fail")}
	got = consumer.Deliver(bad)
	require.Equal(t, ferrydriver.InboxFailed, got.State)
	require.Equal(t, 1, got.Attempts)
	require.Contains(t, got.Error, "the handler refused it")
	got = consumer.Settle(bad.ID)
	require.Equal(t, ferrydriver.InboxDead, got.State, "DEAD after MaxAttempts")
	require.Equal(t, 2, got.Attempts)

	n, err := counts(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n[ok.ID], "the effect committed once with the event")
	require.Zero(t, n[bad.ID], "a failed attempt's effect rolled back")
}
