package ferrydrivertest

import (
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
)

// testParking exercises the parking of ferrydriver.Store: per-key queues in order,
// fencing, heads by key and for the whole feed, unpark with and without a
// dead letter, hold and release (retry or skip).
func testParking[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	const feed = "park/0"
	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	a1, a2, a3 := Event("t", "a", "a1"), Event("t", "a", "a2"), Event("t", "a", "a3")
	b1 := Event("t", "b", "b1")
	a1.Headers = map[string]string{"traceparent": "00-x"}
	park := func(term int64, evs ...*ferryevent.Event) error {
		return drv.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: feed, Holder: "a", Term: term, Events: evs, Reason: "503"})
	}
	require.NoError(t, park(l.Term, a1, b1, a2))
	require.NoError(t, park(l.Term, a3))
	require.NoError(t, park(l.Term, a1), "parking an event again is harmless")
	require.ErrorIs(t, park(l.Term+1, Event("t", "a", "x")), ferrydriver.ErrLeaseLost)

	all, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed})
	require.NoError(t, err)
	require.Len(t, all, 2)
	byKey := map[string]*ferrydriver.ParkedEvent{}
	for _, h := range all {
		byKey[h.Event.Key] = h
	}
	require.Equal(t, a1.ID, byKey["a"].Event.ID)
	require.Equal(t, a1.Headers, byKey["a"].Event.Headers)
	require.Equal(t, a1.Payload, byKey["a"].Event.Payload)
	require.EqualValues(t, 3, byKey["a"].Queued)
	require.EqualValues(t, 1, byKey["b"].Queued)
	require.Equal(t, "503", byKey["a"].Reason)
	require.False(t, byKey["a"].Held)

	heads := func(keys ...string) []string {
		hs, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed, Keys: keys})
		require.NoError(t, err)
		var out []string
		for _, h := range hs {
			out = append(out, string(h.Event.Payload))
		}
		return out
	}
	unpark := func(term int64, ev *ferryevent.Event, dl *ferrydriver.DeadLetter) error {
		return drv.UnparkEvent(ctx, &ferrydriver.UnparkEventParams{Feed: feed, Holder: "a", Term: term, Key: ev.Key, EventID: ev.ID, DeadLetter: dl})
	}
	require.ElementsMatch(t, []string{"a1", "b1"}, heads("a", "b", "none"))
	require.ErrorIs(t, unpark(l.Term+1, a1, nil), ferrydriver.ErrLeaseLost)
	require.NoError(t, unpark(l.Term, a1, nil))
	require.Equal(t, []string{"a2"}, heads("a"), "the queue keeps its order")
	require.NoError(t, unpark(l.Term, a2, &ferrydriver.DeadLetter{Feed: feed, Event: *a2, Reason: "gave up"}))
	dl, err := drv.GetDeadLetter(ctx, ferrydriver.DeadLetterRef{Feed: feed, EventID: a2.ID})
	require.NoError(t, err)
	require.Equal(t, "gave up", dl.Reason)
	require.Equal(t, a2.Payload, dl.Event.Payload)

	require.NoError(t, drv.HoldParked(ctx, &ferrydriver.HoldParkedParams{Feed: feed, Holder: "a", Term: l.Term, Key: "a", EventID: a3.ID, Reason: "gave up after 10 attempts"}))
	hs, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed, Keys: []string{"a"}})
	require.NoError(t, err)
	require.True(t, hs[0].Held)
	require.NoError(t, drv.ReleaseParked(ctx, &ferrydriver.ReleaseParkedParams{Feed: feed, Key: "a"}))
	hs, err = drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed, Keys: []string{"a"}})
	require.NoError(t, err)
	require.False(t, hs[0].Held, "released: the relay retries it")
	require.NoError(t, drv.ReleaseParked(ctx, &ferrydriver.ReleaseParkedParams{Feed: feed, Key: "a", Skip: true}))
	require.Empty(t, heads("a"), "skipped: moved to the dead letters")
	dl, err = drv.GetDeadLetter(ctx, ferrydriver.DeadLetterRef{Feed: feed, EventID: a3.ID})
	require.NoError(t, err)
	require.Contains(t, dl.Reason, "skipped by an operator")
	require.ErrorIs(t, drv.ReleaseParked(ctx, &ferrydriver.ReleaseParkedParams{Feed: feed, Key: "a"}), ferrydriver.ErrNotFound)
	require.Equal(t, []string{"b1"}, heads("a", "b"))
}

// testParkedAttempts: a parked head's failed attempts and the time of the
// first are stored with it (fenced), read back by ParkedHeads in every
// form (by key, the whole feed) by the next leader, reset by a release,
// and a new head starts with none.
func testParkedAttempts[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	const feed = "attempts/0"
	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	k1, k2 := Event("t", "k", "k1"), Event("t", "k", "k2")
	require.NoError(t, drv.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: feed, Holder: "a", Term: l.Term, Events: []*ferryevent.Event{k1, k2}, Reason: "503"}))
	head := func() *ferrydriver.ParkedEvent {
		t.Helper()
		byKey, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed, Keys: []string{"k"}})
		require.NoError(t, err)
		require.Len(t, byKey, 1)
		all, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed})
		require.NoError(t, err)
		require.Len(t, all, 1)
		require.Equal(t, byKey[0].Attempts, all[0].Attempts, "both forms of ParkedHeads read the attempts")
		require.True(t, byKey[0].FirstFailure.Equal(all[0].FirstFailure))
		return byKey[0]
	}
	h0 := head()
	require.Zero(t, h0.Attempts, "a parked head has no attempts recorded to begin with")
	require.True(t, h0.FirstFailure.IsZero())

	first := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	set := func(term int64, ev *ferryevent.Event, n int) error {
		return drv.SetParkedAttempts(ctx, &ferrydriver.SetParkedAttemptsParams{Feed: feed, Holder: "a", Term: term, Key: "k", EventID: ev.ID, Attempts: n, FirstFailure: first})
	}
	require.NoError(t, set(l.Term, k1, 7))
	require.ErrorIs(t, set(l.Term+1, k1, 99), ferrydriver.ErrLeaseLost, "fenced")

	// The next leader reads them back.
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "a", Term: l.Term}))
	l2, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "b", TTL: time.Minute})
	require.NoError(t, err)
	h1 := head()
	require.Equal(t, k1.ID, h1.Event.ID)
	require.Equal(t, 7, h1.Attempts)
	require.WithinDuration(t, first, h1.FirstFailure, time.Millisecond)

	// A release lets the relay retry the head afresh.
	require.NoError(t, drv.HoldParked(ctx, &ferrydriver.HoldParkedParams{Feed: feed, Holder: "b", Term: l2.Term, Key: "k", EventID: k1.ID, Reason: "gave up"}))
	require.NoError(t, drv.ReleaseParked(ctx, &ferrydriver.ReleaseParkedParams{Feed: feed, Key: "k"}))
	h2 := head()
	require.Zero(t, h2.Attempts, "released: the attempts start afresh")
	require.True(t, h2.FirstFailure.IsZero())

	// The next head starts with none.
	require.NoError(t, drv.SetParkedAttempts(ctx, &ferrydriver.SetParkedAttemptsParams{Feed: feed, Holder: "b", Term: l2.Term, Key: "k", EventID: k1.ID, Attempts: 3, FirstFailure: first}))
	require.NoError(t, drv.UnparkEvent(ctx, &ferrydriver.UnparkEventParams{Feed: feed, Holder: "b", Term: l2.Term, Key: "k", EventID: k1.ID}))
	h3 := head()
	require.Equal(t, k2.ID, h3.Event.ID)
	require.Zero(t, h3.Attempts)
	require.True(t, h3.FirstFailure.IsZero())
}

// testListLeases exercises ferrydriver.Store.ListLeases.
func testListLeases[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	for _, n := range []string{"members/f/b", "members/f/a", "members/g/a", "members/f"} {
		_, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: n, Holder: "h-" + n, TTL: time.Minute})
		require.NoError(t, err)
	}
	_, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "members/f/short", Holder: "x", TTL: time.Second})
	require.NoError(t, err)
	got, err := drv.ListLeases(ctx, "members/f/")
	require.NoError(t, err)
	var names []string
	for _, l := range got {
		names = append(names, l.Name)
	}
	require.Equal(t, []string{"members/f/a", "members/f/b", "members/f/short"}, names, "prefix match, in name order")
	require.Equal(t, "h-members/f/a", got[0].Holder)
	require.True(t, got[0].Held(got[0].Holder))
	none, err := drv.ListLeases(ctx, "members/zz")
	require.NoError(t, err)
	require.Empty(t, none)
	// A prefix is not a pattern.
	_, err = drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "m_x", Holder: "y", TTL: time.Minute})
	require.NoError(t, err)
	under, err := drv.ListLeases(ctx, "m_")
	require.NoError(t, err)
	require.Len(t, under, 1)
}
