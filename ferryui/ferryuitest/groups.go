package ferryuitest

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferryevent"
)

func (s *suite) groupsAndTheirEvents(t *testing.T) {
	pending := s.pending
	c := &client{t: t, url: s.url}
	var out struct {
		Groups []uiapi.GroupJSON
	}
	c.get("/api/v1/groups", http.StatusOK, &out)
	var billing *uiapi.GroupJSON
	for i := range out.Groups {
		if out.Groups[i].Group == "billing" {
			billing = &out.Groups[i]
		}
	}
	require.NotNil(t, billing, "the group that stored its policy is listed: %+v", out.Groups)
	require.EqualValues(t, 2, billing.Counts["dead"])
	require.EqualValues(t, 1, billing.Counts["pending"])
	require.Equal(t, "hold", billing.DeadPolicy, "the stored policy")

	var page struct {
		Events     []uiapi.InboxRowJSON
		DeadPolicy string `json:"dead_policy"`
	}
	body := c.get("/api/v1/groups/billing/events", http.StatusOK, &page)
	require.Len(t, page.Events, 2, "DEAD by default")
	require.Equal(t, "hold", page.DeadPolicy)
	require.NotContains(t, body, "<script>")
	for _, e := range page.Events {
		require.Equal(t, "dead", e.State)
		require.Equal(t, "handler: "+Hostile, e.LastError)
	}
	c.get("/api/v1/groups/billing/events?state=pending,dead&key=c", http.StatusOK, &page)
	require.Len(t, page.Events, 1)
	require.Equal(t, pending.ID.String(), page.Events[0].Event.ID)
	// A type is matched over at most scan= rows: of DEAD ones, a page
	// at a time from a cursor; of PENDING ones, the newest, once.
	var typed struct {
		Events  []uiapi.InboxRowJSON
		Next    string
		Scanned int
	}
	c.get("/api/v1/groups/billing/events?state=dead&type=Tested&scan=1", http.StatusOK, &typed)
	require.Len(t, typed.Events, 1)
	require.Equal(t, 1, typed.Scanned)
	require.NotEmpty(t, typed.Next)
	firstTyped := typed.Events[0].Event.ID
	nextTyped := typed.Next
	typed.Events, typed.Next = nil, ""
	c.get("/api/v1/groups/billing/events?state=dead&type=Tested&scan=1&after="+url.QueryEscape(nextTyped), http.StatusOK, &typed)
	require.Len(t, typed.Events, 1)
	require.NotEqual(t, firstTyped, typed.Events[0].Event.ID)
	typed.Events, typed.Next = nil, ""
	c.get("/api/v1/groups/billing/events?state=dead&type=Other", http.StatusOK, &typed)
	require.Empty(t, typed.Events)
	require.Empty(t, typed.Next, "both DEAD events read, none of type Other")
	require.Equal(t, 2, typed.Scanned)
	typed.Events = nil
	c.get("/api/v1/groups/billing/events?state=pending&type=Tested", http.StatusOK, &typed)
	require.Len(t, typed.Events, 1)
	require.Equal(t, pending.ID.String(), typed.Events[0].Event.ID)
	// A key over PROCESSED rows (no key index covers them): matched
	// here, like a type.
	typed.Events, typed.Scanned = nil, 0
	c.get("/api/v1/groups/billing/events?state=processed&key=a", http.StatusOK, &typed)
	require.Empty(t, typed.Events)

	// DEAD events a page at a time: the first page's "next" gives the
	// second, which holds the other.
	var first struct {
		Events []uiapi.InboxRowJSON
		Next   string
	}
	c.get("/api/v1/groups/billing/events?limit=1", http.StatusOK, &first)
	require.Len(t, first.Events, 1)
	require.NotEmpty(t, first.Next)
	var second struct {
		Events []uiapi.InboxRowJSON
		Next   string
	}
	c.get("/api/v1/groups/billing/events?limit=1&after="+url.QueryEscape(first.Next), http.StatusOK, &second)
	require.Len(t, second.Events, 1)
	require.NotEqual(t, first.Events[0].Event.ID, second.Events[0].Event.ID)
	var third struct{ Events []uiapi.InboxRowJSON }
	c.get("/api/v1/groups/billing/events?limit=1&after="+url.QueryEscape(second.Next), http.StatusOK, &third)
	require.Empty(t, third.Events, "two DEAD events, two pages")
	for _, bad := range []string{"after=yesterday", "state=pending&after=" + url.QueryEscape(first.Next)} {
		var e struct{ Error string }
		c.get("/api/v1/groups/billing/events?"+bad, http.StatusBadRequest, &e)
		require.NotEmpty(t, e.Error, bad)
	}
}

func (s *suite) groupActions(t *testing.T) {
	dead1, dead2 := s.dead1, s.dead2
	c := &client{t: t, url: s.url}
	var res uiapi.ActionResult
	c.post("/api/v1/groups/billing/redrive", `{"ids":["`+dead1.ID.String()+`"]}`, http.StatusOK, &res)
	require.Equal(t, 1, res.Done)
	var tl uiapi.EventTimelineJSON
	c.get("/api/v1/events/"+dead1.ID.String(), http.StatusOK, &tl)
	require.Len(t, tl.Groups, 1)
	require.Equal(t, "pending", tl.Groups[0].State, "a redriven event runs again")
	// Its history: the failed attempt with its error, the redrive.
	h := tl.Groups[0].History
	require.Len(t, h, 2)
	require.Equal(t, uiapi.AttemptJSON{Attempt: 1, State: "dead", Error: "handler: " + Hostile}, uiapi.AttemptJSON{Attempt: h[0].Attempt, State: h[0].State, Error: h[0].Error})
	require.Equal(t, uiapi.AttemptJSON{Attempt: 1, State: "pending"}, uiapi.AttemptJSON{Attempt: h[1].Attempt, State: h[1].State, Error: h[1].Error})
	require.False(t, h[1].At.Before(h[0].At))
	c.post("/api/v1/groups/billing/discard", `{"filter":{"key":"b"},"dry_run":true}`, http.StatusOK, &res)
	require.Equal(t, 1, res.Selected)
	c.post("/api/v1/groups/billing/discard", `{"filter":{"key":"b"},"expect":1}`, http.StatusOK, &res)
	require.Equal(t, 1, res.Done)
	c.get("/api/v1/events/"+dead2.ID.String(), http.StatusOK, &tl)
	require.Equal(t, "discarded", tl.Groups[0].State)
	var pol map[string]any
	c.post("/api/v1/groups/billing/policy", `{"hold_dead":false}`, http.StatusOK, &pol)
	require.Equal(t, false, pol["hold_dead"])
	var groups struct{ Groups []uiapi.GroupJSON }
	c.get("/api/v1/groups", http.StatusOK, &groups)
	policies := map[string]string{}
	for _, g := range groups.Groups {
		policies[g.Group] = g.DeadPolicy
	}
	require.Equal(t, "continue", policies["billing"], "the new policy is what the groups list says")
	c.post("/api/v1/groups/billing/policy", `{}`, http.StatusBadRequest, nil)
}

func (s *suite) eventTimeline(t *testing.T) {
	ctx, store, inbox, hostile, pending := s.ctx, s.store, s.inbox, s.hostile, s.pending
	c := &client{t: t, url: s.url}
	var tl uiapi.EventTimelineJSON
	c.get("/api/v1/events/"+hostile.ID.String(), http.StatusOK, &tl)
	require.Len(t, tl.DeadLetters, 1)
	require.Empty(t, tl.Groups)
	require.Equal(t, Hostile, tl.DeadLetters[0].Event.Key)
	require.Equal(t, "default/0", tl.DeadLetters[0].Feed, "the timeline says which feed dead-lettered it")
	tl = uiapi.EventTimelineJSON{}
	c.get("/api/v1/events/"+pending.ID.String(), http.StatusOK, &tl)
	require.Empty(t, tl.DeadLetters)
	require.Len(t, tl.Groups, 1)
	require.Equal(t, "billing", tl.Groups[0].Group)

	// Events the relay has not published yet are found in the backlog,
	// with how many events of the partition it reads before them.
	waiting := []*ferryevent.Event{ferrydrivertest.Event("orders", "w", "1"), ferrydrivertest.Event("orders", "w", "2"), ferrydrivertest.Event("orders", "w", Hostile)}
	require.NoError(t, store.Append(ctx, waiting))
	var first, last uiapi.EventTimelineJSON
	c.get("/api/v1/events/"+waiting[0].ID.String(), http.StatusOK, &first)
	body := c.get("/api/v1/events/"+waiting[2].ID.String(), http.StatusOK, &last)
	require.NotContains(t, body, "<script>")
	require.NotNil(t, first.Outbox)
	require.NotNil(t, last.Outbox)
	require.Empty(t, last.Groups)
	require.Empty(t, last.DeadLetters)
	require.Equal(t, "default/0", last.Outbox.Feed)
	require.Equal(t, first.Outbox.Ahead+2, last.Outbox.Ahead, "the key's events in order")
	require.Equal(t, Hostile, *last.Outbox.Event.PayloadText)
	if _, ok := store.(ferrydriver.KeySeqStore); ok {
		require.Zero(t, last.Outbox.Event.Seq, "the relay numbers an event as it reads it")
	} else {
		require.Equal(t, first.Outbox.Event.Seq+2, last.Outbox.Event.Seq)
	}
	var e struct{ Error string }
	c.get("/api/v1/events/"+waiting[2].ID.String()+"?scan="+fmt.Sprint(first.Outbox.Ahead+2), http.StatusNotFound, &e)
	require.Contains(t, e.Error, "not among the first")
	c.get("/api/v1/events/"+waiting[2].ID.String()+"?scan=0", http.StatusBadRequest, &e)

	// An event whose source was undone (a chain reorg) reads retracted.
	undone := ferrydrivertest.Event("blocks", "0xabc", "log")
	_, err := inbox.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "indexer", Events: []*ferryevent.Event{undone}})
	require.NoError(t, err)
	_, err = inbox.RetractInbox(ctx, &ferrydriver.RetractInboxParams{Group: "indexer", Retractions: []ferrydriver.Retraction{{Event: undone}}})
	require.NoError(t, err)
	tl = uiapi.EventTimelineJSON{}
	c.get("/api/v1/events/"+undone.ID.String(), http.StatusOK, &tl)
	require.Len(t, tl.Groups, 1)
	require.Equal(t, "indexer", tl.Groups[0].Group)
	require.Equal(t, "retracted", tl.Groups[0].State)
	// Group indexer has had no consumer (no stored policy): it is
	// listed all the same, as holding.
	var groups struct{ Groups []uiapi.GroupJSON }
	c.get("/api/v1/groups", http.StatusOK, &groups)
	listed := map[string]string{}
	for _, g := range groups.Groups {
		listed[g.Group] = g.DeadPolicy
	}
	require.Equal(t, "hold", listed["indexer"], "a group with events and no consumer yet: %v", listed)
}

func (s *suite) whereAKeyStands(t *testing.T) {
	ctx, store, inbox, lease, hostile, plain1 := s.ctx, s.store, s.inbox, s.lease, s.hostile, s.plain1
	c := &client{t: t, url: s.url}
	// Group shipping: key z's head is dead, its next event waits.
	head, next := ferrydrivertest.Event("orders", "z", "1"), ferrydrivertest.Event("orders", "z", "2")
	head.Seq, next.Seq = 1, 2
	require.NoError(t, inbox.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: "shipping", HoldDead: true}))
	_, err := inbox.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "shipping", Events: []*ferryevent.Event{head, next}})
	require.NoError(t, err)
	rows, err := inbox.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "shipping", Worker: "suite", Limit: 10, TTL: time.Minute, MaxAttempts: 10})
	require.NoError(t, err)
	require.Len(t, rows, 1, "one head per key")
	require.NoError(t, inbox.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "shipping", EventID: rows[0].Event.ID, Claim: rows[0].Claim, Error: "no address", Dead: true}))

	var k uiapi.KeyJSON
	c.get("/api/v1/keys/z", http.StatusOK, &k)
	require.Equal(t, "z", k.Key)
	require.Empty(t, k.DeadLetters)
	require.Empty(t, k.Parked)
	require.Len(t, k.Groups, 1)
	require.Equal(t, "shipping", k.Groups[0].Group)
	require.Len(t, k.Groups[0].Events, 2)
	require.Equal(t, []string{"dead", "pending"}, []string{k.Groups[0].Events[0].State, k.Groups[0].Events[1].State}, "the head first")
	require.Equal(t, head.ID.String(), k.Groups[0].Events[0].Event.ID)
	require.Equal(t, "no address", k.Groups[0].Events[0].LastError)

	k = uiapi.KeyJSON{}
	body := c.get("/api/v1/keys/"+url.PathEscape(Hostile), http.StatusOK, &k)
	require.NotContains(t, body, "<script>")
	require.Equal(t, Hostile, k.Key)
	require.Len(t, k.DeadLetters, 1, "the relay dead letter of the hostile key")
	require.Equal(t, hostile.ID.String(), k.DeadLetters[0].Event.ID)

	parked := ferrydrivertest.Event("orders", "p", "parked")
	require.NoError(t, store.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: "default/0", Holder: "suite", Term: lease.Term, Events: []*ferryevent.Event{parked}, Reason: "not acknowledged"}))
	var list struct{ Parked []uiapi.ParkedJSON }
	c.get("/api/v1/parked", http.StatusOK, &list)
	byKey := map[string]uiapi.ParkedJSON{}
	for _, p := range list.Parked {
		byKey[p.Key] = p
	}
	require.Len(t, byKey, 2, "p, and k1, whose dead letter was redriven to default/0")
	require.True(t, byKey["k1"].Redriven, "a redriven dead letter waits for its feed's relay")
	require.Equal(t, plain1.ID.String(), byKey["k1"].Event.ID)
	p := byKey["p"]
	require.Equal(t, "default/0", p.Feed)
	require.False(t, p.Held)
	require.False(t, p.Redriven)
	require.EqualValues(t, 1, p.Queued)
	require.Equal(t, "not acknowledged", p.Reason)
	k = uiapi.KeyJSON{}
	c.get("/api/v1/keys/p", http.StatusOK, &k)
	require.Len(t, k.Parked, 1)
	require.Equal(t, parked.ID.String(), k.Parked[0].Event.ID)
}
