package ferrydrivertest

import (
	"context"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func testDeadLetters[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	const feed = "dl/0"
	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	e1, e2 := Event("orders", "k1", "one"), Event("payments", "k2", "two")
	e1.Headers = map[string]string{"h": "v"}
	dls := []*ferrydriver.DeadLetter{{Event: *e1, Reason: "too large"}, {Event: *e2, Reason: "unroutable"}}
	p := &ferrydriver.InsertDeadLettersParams{Feed: feed, Holder: "a", Term: l.Term, DeadLetters: dls}
	require.NoError(t, drv.InsertDeadLetters(ctx, p))
	require.NoError(t, drv.InsertDeadLetters(ctx, p), "inserting again is harmless")

	all, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: feed})
	require.NoError(t, err)
	require.Len(t, all, 2)
	byKey, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Key: "k2"})
	require.NoError(t, err)
	require.Len(t, byKey, 1)
	require.Equal(t, "unroutable", byKey[0].Reason)
	byTopic, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Topic: "orders", Since: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Len(t, byTopic, 1)
	none, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Until: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Empty(t, none)

	got, err := drv.GetDeadLetter(ctx, ferrydriver.DeadLetterRef{Feed: feed, EventID: e1.ID})
	require.NoError(t, err)
	require.Equal(t, "too large", got.Reason)
	require.Equal(t, e1.Payload, got.Event.Payload)
	require.Equal(t, e1.Headers, got.Event.Headers)
	_, err = drv.GetDeadLetter(ctx, ferrydriver.DeadLetterRef{Feed: feed, EventID: ferryevent.NewID()})
	require.ErrorIs(t, err, ferrydriver.ErrNotFound)
}

// testDeadLettersByFeedAndReason: a feed's name selects every partition
// of it and no other feed's, a partition's name that partition; a reason
// selects the dead letters whose reason contains it; the count is of
// every match.
func testDeadLettersByFeedAndReason[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	h0, h1, other, nested := Event("t", "k", "h0"), Event("t", "k", "h1"), Event("t", "k", "hooksx"), Event("t", "k", "nested")
	insertDeadLettersWhy(ctx, t, drv, "hooks/0", "410 Gone", h0)
	insertDeadLettersWhy(ctx, t, drv, "hooks/1", "timeout after 3s", h1)
	insertDeadLettersWhy(ctx, t, drv, "hooksx/0", "410 Gone", other)
	insertDeadLettersWhy(ctx, t, drv, "hooks/x/0", "410 Gone", nested)
	list := func(p *ferrydriver.ListDeadLettersParams) []string {
		t.Helper()
		dls, err := drv.ListDeadLetters(ctx, p)
		require.NoError(t, err)
		var out []string
		for _, dl := range dls {
			out = append(out, string(dl.Event.Payload))
		}
		n, err := drv.CountDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: p.Feed, Reason: p.Reason, Limit: 1})
		require.NoError(t, err)
		require.EqualValues(t, len(out), n, "the count is of every match, whatever the limit")
		return out
	}
	require.ElementsMatch(t, []string{"h0", "h1"}, list(&ferrydriver.ListDeadLettersParams{Feed: "hooks"}), "a feed's name: every partition of it")
	require.Equal(t, []string{"h1"}, list(&ferrydriver.ListDeadLettersParams{Feed: "hooks/1"}), "a partition's name: that partition")
	require.Equal(t, []string{"nested"}, list(&ferrydriver.ListDeadLettersParams{Feed: "hooks/x"}))
	require.Empty(t, list(&ferrydriver.ListDeadLettersParams{Feed: "hook"}))
	require.ElementsMatch(t, []string{"h0", "hooksx", "nested"}, list(&ferrydriver.ListDeadLettersParams{Reason: "410"}), "a reason: those containing it")
	require.Equal(t, []string{"h0"}, list(&ferrydriver.ListDeadLettersParams{Feed: "hooks", Reason: "Gone"}))
	require.Len(t, list(&ferrydriver.ListDeadLettersParams{}), 4)
	got, err := drv.GetDeadLetter(ctx, ferrydriver.DeadLetterRef{Feed: "hooks", EventID: h1.ID})
	require.NoError(t, err)
	require.Equal(t, "hooks/1", got.Feed)
	_, err = drv.GetDeadLetter(ctx, ferrydriver.DeadLetterRef{Feed: "hooksx", EventID: h1.ID})
	require.ErrorIs(t, err, ferrydriver.ErrNotFound)
	for _, f := range []string{"", "hooks", "hooks/0", "hooks/1", "hooksx", "hooks/x", "hook"} {
		for _, dl := range []string{"hooks/0", "hooks/1", "hooksx/0", "hooks/x/0"} {
			dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: f})
			require.NoError(t, err)
			listed := false
			for _, d := range dls {
				listed = listed || d.Feed == dl
			}
			require.Equal(t, driverkit.InFeed(f, dl), listed, "filter %q, dead letter of %s: the store and InFeed agree", f, dl)
		}
	}
}

// insertDeadLettersWhy stores events as feed's dead letters with a reason.
func insertDeadLettersWhy(ctx context.Context, t *testing.T, drv ferrydriver.Store, feed, reason string, evs ...*ferryevent.Event) {
	t.Helper()
	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "dl", TTL: time.Minute})
	require.NoError(t, err)
	var dls []*ferrydriver.DeadLetter
	for _, ev := range evs {
		dls = append(dls, &ferrydriver.DeadLetter{Event: *ev, Reason: reason})
	}
	require.NoError(t, drv.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: feed, Holder: "dl", Term: l.Term, DeadLetters: dls}))
}

// insertDeadLetters stores events as feed's dead letters under a lease.
func insertDeadLetters(ctx context.Context, t *testing.T, drv ferrydriver.Store, feed string, evs ...*ferryevent.Event) {
	t.Helper()
	insertDeadLettersWhy(ctx, t, drv, feed, "rejected", evs...)
}

// testDeadLetterRetention: a feed's dead letters go once older than the
// retention, oldest first, a limited number per call; other feeds' stay.
func testDeadLetterRetention[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	a1, a2, a3, b1 := Event("t", "k", "a1"), Event("t", "k", "a2"), Event("t", "k", "a3"), Event("t", "k", "b1")
	insertDeadLetters(ctx, t, drv, "a/0", a1)
	time.Sleep(5 * time.Millisecond) // failure times (milliseconds on MongoDB) must differ
	insertDeadLetters(ctx, t, drv, "a/0", a2, a3)
	insertDeadLetters(ctx, t, drv, "b/0", b1)
	time.Sleep(5 * time.Millisecond)

	n, err := drv.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: "a/0", OlderThan: time.Hour, Limit: 10})
	require.NoError(t, err)
	require.Zero(t, n, "nothing is an hour old")
	n, err = drv.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: "a/0", Limit: 1})
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "at most Limit")
	left, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: "a/0"})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{a2.ID.String(), a3.ID.String()}, []string{left[0].Event.ID.String(), left[1].Event.ID.String()}, "the oldest went first")
	n, err = drv.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: "a/0", Limit: 10})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	left, err = drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, b1.ID, left[0].Event.ID, "another feed's dead letters stay")
}

// redrivenHeads returns the payloads of the heads of feed's keys with
// redriven events.
func redrivenHeads(ctx context.Context, t *testing.T, drv ferrydriver.Store, feed string) []string {
	t.Helper()
	heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed, Redriven: true})
	require.NoError(t, err)
	var out []string
	for _, h := range heads {
		out = append(out, string(h.Event.Payload))
	}
	return out
}

// testRedriveDeadLetters: a redriven dead letter goes back to the feed
// that dead-lettered it and to no other: it joins its key's parked queue
// in that feed, behind what the key has parked there, marked redriven,
// whole (ID, Seq, headers, time), and nothing is appended to the outbox,
// which every feed reads. The dead letter is gone, so a second redrive
// finds nothing; once the relay published it (UnparkEvent), the feed has
// no redriven key left.
func testRedriveDeadLetters[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	emit(ctx, t, h, drv, Event("t", "K", "first"))
	r := OpenReader(ctx, t, drv, nil)
	read := r.ReadQuiet(ctx)
	require.Len(t, read, 1)
	first := read[0]
	first.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	insertDeadLetters(ctx, t, drv, "dl/0", first) // as the relay does, with the event as read
	emit(ctx, t, h, drv, Event("t", "K", "second"))
	require.Len(t, r.ReadQuiet(ctx), 1)
	// Key J has an event parked in dl/0 already: a redriven one goes behind.
	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "dl/0", Holder: "dl", TTL: time.Minute})
	require.NoError(t, err)
	stuck, old := Event("t", "J", "stuck"), Event("t", "J", "old")
	require.NoError(t, drv.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: "dl/0", Holder: "dl", Term: l.Term, Events: []*ferryevent.Event{stuck}, Reason: "503"}))
	insertDeadLetters(ctx, t, drv, "dl/0", old)
	require.Empty(t, redrivenHeads(ctx, t, drv, "dl/0"), "no key has a redriven event yet")

	n, err := drv.RedriveDeadLetters(ctx, []ferrydriver.DeadLetterRef{{Feed: "dl/0", EventID: first.ID}, {Feed: "dl/0", EventID: old.ID}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Empty(t, r.ReadQuiet(ctx), "nothing is appended to the outbox: no other feed sees it")
	require.ElementsMatch(t, []string{"first", "stuck"}, redrivenHeads(ctx, t, drv, "dl/0"), "the keys with redriven events, by their heads")
	require.Empty(t, redrivenHeads(ctx, t, drv, "other/0"), "another feed has none")

	heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "dl/0", Keys: []string{"K", "J"}})
	require.NoError(t, err)
	byKey := map[string]*ferrydriver.ParkedEvent{}
	for _, h := range heads {
		byKey[h.Event.Key] = h
	}
	got := byKey["K"].Event
	require.Equal(t, first.ID, got.ID, "the same event ID: consumers deduplicate")
	require.Equal(t, first.Seq, got.Seq, "its Seq")
	require.Equal(t, first.Headers, got.Headers)
	require.Equal(t, first.Payload, got.Payload)
	require.True(t, first.CreatedAt.Equal(got.CreatedAt))
	require.True(t, byKey["K"].Redriven)
	require.Contains(t, byKey["K"].Reason, "rejected", "the reason it was dead-lettered")
	require.Equal(t, stuck.ID, byKey["J"].Event.ID, "J's parked event first")
	require.False(t, byKey["J"].Redriven)
	unpark := func(ev *ferryevent.Event) {
		t.Helper()
		require.NoError(t, drv.UnparkEvent(ctx, &ferrydriver.UnparkEventParams{Feed: "dl/0", Holder: "dl", Term: l.Term, Key: ev.Key, EventID: ev.ID}))
	}
	unpark(stuck)
	heads, err = drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "dl/0", Keys: []string{"J"}})
	require.NoError(t, err)
	require.Equal(t, old.ID, heads[0].Event.ID, "then the redriven one")

	left, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Empty(t, left)
	n, err = drv.RedriveDeadLetters(ctx, []ferrydriver.DeadLetterRef{{Feed: "dl/0", EventID: first.ID}})
	require.NoError(t, err)
	require.Zero(t, n, "gone: nothing to redrive")
	unpark(&got)
	unpark(old)
	require.Empty(t, redrivenHeads(ctx, t, drv, "dl/0"), "published: no redriven key left")
	require.Empty(t, r.ReadQuiet(ctx))
}

// testListFeeds: the store names every feed with a checkpoint, a lease,
// dead letters or parked events, once each, in order; RelayFeeds shows
// every partition of the relay feeds among them (and only relay feeds), a
// feed's or a partition's when asked, and "default"'s on an empty store.
func testListFeeds[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	feeds := func(filter string) []string {
		t.Helper()
		got, err := driverkit.RelayFeeds(ctx, drv, filter)
		require.NoError(t, err)
		return got
	}
	require.Equal(t, []string{"default/0"}, feeds(""), "an empty store: the default feed's")
	require.Equal(t, []string{"shop/0"}, feeds("shop"), "a feed asked for, though nothing is known of it")

	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "a/0", Holder: "r", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: "a/0", Cursor: []byte("c"), Holder: "r", Term: l.Term}))
	for _, name := range []string{"b/1", "members/a/r#1", "chain/eth", "consumer-gauges/7"} {
		_, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "r", TTL: time.Minute})
		require.NoError(t, err)
	}
	insertDeadLetters(ctx, t, drv, "c/0", Event("t", "k", "x"), Event("t", "k2", "y"))
	insertDeadLetters(ctx, t, drv, "c/0", Event("t", "k3", "z"))
	l, err = drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "d/2", Holder: "r", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: "d/2", Holder: "r", Term: l.Term, Events: []*ferryevent.Event{Event("t", "k", "p")}}))
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: "d/2", Holder: "r", Term: l.Term}))
	names, err := drv.ListFeeds(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"a/0", "b/1", "c/0", "chain/eth", "consumer-gauges/7", "d/2", "members/a/r#1"}, names,
		"each name once, in order: checkpoints, leases, dead letters, parked events")
	require.Equal(t, []string{"a/0", "b/0", "b/1", "c/0", "d/0", "d/2"}, feeds(""), "every partition of each relay feed, and only relay feeds")
	require.Equal(t, []string{"b/0", "b/1"}, feeds("b"))
	require.Equal(t, []string{"b/1"}, feeds("b/1"))
	require.Equal(t, []string{"d/2"}, feeds("d/2"))
}

// testRedriveSelection: redrive and discard act on the dead letters
// named, each by feed and event, and on no other: an event dead-lettered
// by two feeds keeps the other feed's dead letter, and a redrive goes to
// the feed named only; an empty selection is nothing, never every feed; a
// named dead letter already gone is not counted; a dead letter that is not
// a valid event stops the redrive, changing nothing, and can be discarded.
func testRedriveSelection[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	r := OpenReader(ctx, t, drv, nil)
	a, b, c := Event("orders", "ka", "a"), Event("payments", "kb", "b"), Event("orders", "kc", "c")
	insertDeadLetters(ctx, t, drv, "f/0", a, b, c)
	insertDeadLetters(ctx, t, drv, "g/0", c)
	refs := func(pairs ...any) []ferrydriver.DeadLetterRef {
		var sel []ferrydriver.DeadLetterRef
		for i := 0; i < len(pairs); i += 2 {
			sel = append(sel, ferrydriver.DeadLetterRef{Feed: pairs[i].(string), EventID: pairs[i+1].(*ferryevent.Event).ID})
		}
		return sel
	}
	left := func() []string {
		t.Helper()
		dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
		require.NoError(t, err)
		var out []string
		for _, dl := range dls {
			out = append(out, dl.Feed+" "+string(dl.Event.Payload))
		}
		return out
	}

	n, err := drv.RedriveDeadLetters(ctx, refs())
	require.NoError(t, err)
	require.Zero(t, n, "no dead letter named: none, never every feed's")
	n, err = drv.DiscardDeadLetters(ctx, refs())
	require.NoError(t, err)
	require.Zero(t, n)
	require.Len(t, left(), 4)

	n, err = drv.RedriveDeadLetters(ctx, refs("f/0", c, "f/0", b))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.ElementsMatch(t, []string{"b", "c"}, redrivenHeads(ctx, t, drv, "f/0"), "back to f/0")
	require.Empty(t, redrivenHeads(ctx, t, drv, "g/0"), "and not to g/0")
	require.Empty(t, r.ReadQuiet(ctx), "nor to the outbox")
	require.ElementsMatch(t, []string{"f/0 a", "g/0 c"}, left(), "g/0's dead letter of c stays")

	n, err = drv.DiscardDeadLetters(ctx, refs("f/0", c, "g/0", a))
	require.NoError(t, err)
	require.Zero(t, n, "f/0's c is gone and g/0 has no a: nothing")
	n, err = drv.DiscardDeadLetters(ctx, refs("g/0", c))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"f/0 a"}, left(), "f/0's dead letter of a stays")

	bad := Event("orders", "kx", "undecodable")
	bad.Topic = "" // as a record the feed could not decode is dead-lettered
	insertDeadLetters(ctx, t, drv, "f/0", bad)
	_, err = drv.RedriveDeadLetters(ctx, refs("f/0", a, "f/0", bad))
	require.Error(t, err)
	require.Contains(t, err.Error(), bad.ID.String())
	require.Contains(t, err.Error(), "discard")
	require.Len(t, left(), 2, "nothing changed: a and bad are still there")
	require.ElementsMatch(t, []string{"b", "c"}, redrivenHeads(ctx, t, drv, "f/0"), "and nothing was parked")

	n, err = drv.DiscardDeadLetters(ctx, refs("f/0", bad))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{EventIDs: []uuid.UUID{a.ID, bad.ID}})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, a.ID, got[0].Event.ID, "the list selects by event ID too")
	require.Empty(t, r.ReadQuiet(ctx), "a discarded dead letter is not published")
}
