package ferryuitest

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferryevent"
)

func (s *suite) deadLettersArePagedAndShownExactly(t *testing.T) {
	hostile, plain1, plain2, binary := s.hostile, s.plain1, s.plain2, s.binary
	c := &client{t: t, url: s.url}
	var page struct {
		DeadLetters []uiapi.DeadLetterJSON `json:"dead_letters"`
		Next        string                 `json:"next"`
	}
	body := c.get("/api/v1/dead-letters?limit=2", http.StatusOK, &page)
	require.Len(t, page.DeadLetters, 2)
	require.NotEmpty(t, page.Next, "a full page says where the next starts")
	require.NotContains(t, body, "<script>", "the JSON escapes markup")
	seen := map[string]uiapi.DeadLetterJSON{}
	for _, dl := range page.DeadLetters {
		seen[dl.Event.ID] = dl
	}
	next := page.Next
	page.DeadLetters, page.Next = nil, "" // decoding into the old page would overwrite what seen holds
	c.get("/api/v1/dead-letters?limit=2&after="+url.QueryEscape(next), http.StatusOK, &page)
	for _, dl := range page.DeadLetters {
		seen[dl.Event.ID] = dl
	}
	require.Len(t, seen, 4, "two pages hold the four dead letters (a relay batch's share one failure time)")
	require.NotEmpty(t, page.Next)
	next = page.Next
	page.DeadLetters = nil
	c.get("/api/v1/dead-letters?limit=2&after="+url.QueryEscape(next), http.StatusOK, &page)
	require.Empty(t, page.DeadLetters, "nothing after the last")
	h := seen[hostile.ID.String()]
	require.Equal(t, Hostile, h.Event.Key)
	require.Equal(t, []byte(Hostile), h.Event.Payload)
	require.NotNil(t, h.Event.PayloadText)
	require.Equal(t, Hostile, *h.Event.PayloadText)
	require.Equal(t, Hostile, h.Event.Headers["x-note"])
	require.Equal(t, "refused: "+Hostile, h.Reason)
	b := seen[binary.ID.String()]
	require.Equal(t, binary.Payload, b.Event.Payload, "binary payloads round-trip as base64")
	require.Nil(t, b.Event.PayloadText, "a payload that is not UTF-8 is not shown as text")

	var one uiapi.DeadLettersOfJSON
	c.get("/api/v1/dead-letters/"+plain1.ID.String(), http.StatusOK, &one)
	require.Len(t, one.DeadLetters, 1)
	require.Equal(t, "k1", one.DeadLetters[0].Event.Key)
	require.Equal(t, "default/0", one.DeadLetters[0].Feed, "each dead letter says its feed")
	page.DeadLetters = nil
	c.get("/api/v1/dead-letters?topic=invoices", http.StatusOK, &page)
	require.Len(t, page.DeadLetters, 1)
	require.Equal(t, plain2.ID.String(), page.DeadLetters[0].Event.ID)

	// A topic or a type, which no index serves, is matched over at most
	// scan= dead letters from where the page starts: those listed before
	// the invoice are no invoices; "next" goes on after them.
	var all, scanned struct {
		DeadLetters []uiapi.DeadLetterJSON `json:"dead_letters"`
		Next        string                 `json:"next"`
		Scanned     int                    `json:"scanned"`
	}
	c.get("/api/v1/dead-letters?limit=4", http.StatusOK, &all)
	at := slices.IndexFunc(all.DeadLetters, func(dl uiapi.DeadLetterJSON) bool { return dl.Event.ID == plain2.ID.String() })
	require.GreaterOrEqual(t, at, 0)
	if at > 0 {
		c.get("/api/v1/dead-letters?topic=invoices&scan="+fmt.Sprint(at), http.StatusOK, &scanned)
		require.Empty(t, scanned.DeadLetters)
		require.Equal(t, at, scanned.Scanned)
		require.NotEmpty(t, scanned.Next, "the walk goes on from the dead letter it read last")
		next = scanned.Next
		scanned.Next = ""
		c.get("/api/v1/dead-letters?topic=invoices&scan=1&after="+url.QueryEscape(next), http.StatusOK, &scanned)
	} else {
		c.get("/api/v1/dead-letters?topic=invoices&scan=1", http.StatusOK, &scanned)
	}
	require.Len(t, scanned.DeadLetters, 1)
	require.Equal(t, plain2.ID.String(), scanned.DeadLetters[0].Event.ID)
	require.Equal(t, 1, scanned.Scanned)
	scanned.DeadLetters, scanned.Next = nil, ""
	c.get("/api/v1/dead-letters?type=Tested&topic=orders&limit=5", http.StatusOK, &scanned)
	require.Len(t, scanned.DeadLetters, 3, "the orders, read to the end of the list")
	require.Empty(t, scanned.Next, "the list ended before the page was full")
	require.Equal(t, 4, scanned.Scanned)
	c.get("/api/v1/dead-letters?type=Tested&scan=0", http.StatusBadRequest, nil)
}

func (s *suite) redriveAndDiscardDeadLetters(t *testing.T) {
	plain1, plain2 := s.plain1, s.plain2
	c := &client{t: t, url: s.url}
	var res uiapi.ActionResult
	c.post("/api/v1/dead-letters/redrive", `{"filter":{"topic":"orders"},"dry_run":true}`, http.StatusOK, &res)
	require.Equal(t, 3, res.Selected, "a dry run counts what the filter selects")
	require.Zero(t, res.Done)
	c.post("/api/v1/dead-letters/redrive", `{"filter":{"topic":"orders"},"expect":2}`, http.StatusConflict, nil)
	c.post("/api/v1/dead-letters/redrive", `{"ids":["`+plain1.ID.String()+`"]}`, http.StatusBadRequest, nil)
	c.post("/api/v1/dead-letters/redrive", `{"letters":[{"feed":"default/1","id":"`+plain1.ID.String()+`"}],"dry_run":true}`, http.StatusOK, &res)
	require.Zero(t, res.Selected, "default/1 has no dead letter of it")
	c.post("/api/v1/dead-letters/redrive", `{"letters":[{"feed":"default/0","id":"`+plain1.ID.String()+`"}],"expect":1}`, http.StatusOK, &res)
	require.Equal(t, 1, res.Done)
	require.Equal(t, []uiapi.LetterRef{{Feed: "default/0", ID: plain1.ID.String()}}, res.Letters)
	c.get("/api/v1/dead-letters/"+plain1.ID.String(), http.StatusNotFound, nil)
	c.post("/api/v1/dead-letters/discard", `{"filter":{"topic":"invoices"}}`, http.StatusOK, &res)
	require.Equal(t, 1, res.Done)
	c.get("/api/v1/dead-letters/"+plain2.ID.String(), http.StatusNotFound, nil)
	c.post("/api/v1/dead-letters/discard", `{}`, http.StatusBadRequest, nil)
	c.post("/api/v1/dead-letters/discard", `{"ids":["x"],"surprise":1}`, http.StatusBadRequest, nil)
}

func (s *suite) actionsByFilterStayInTheirFeed(t *testing.T) {
	ctx, store := s.ctx, s.store
	c := &client{t: t, url: s.url}
	// One event dead-lettered by feeds a/0 and b/0, and a/0's older
	// letters: an action through a/0's filter reaches a/0's letters
	// only, whatever the other feeds hold.
	shared := ferrydrivertest.Event("orders", "shared", "x")
	older := ferrydrivertest.Event("orders", "older", "y")
	for _, feed := range []string{"b/0", "a/0"} {
		lease, err := store.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "suite", TTL: time.Minute})
		require.NoError(t, err)
		dls := []*ferrydriver.DeadLetter{{Feed: feed, Event: *shared, Reason: "refused by " + feed}}
		if feed == "b/0" {
			dls = append(dls, &ferrydriver.DeadLetter{Feed: feed, Event: *older, Reason: "refused by " + feed})
		}
		require.NoError(t, store.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: feed, Holder: "suite", Term: lease.Term, DeadLetters: dls}))
	}
	var both uiapi.DeadLettersOfJSON
	c.get("/api/v1/dead-letters/"+shared.ID.String(), http.StatusOK, &both)
	var feeds []string
	for _, dl := range both.DeadLetters {
		feeds = append(feeds, dl.Feed)
	}
	require.ElementsMatch(t, []string{"a/0", "b/0"}, feeds, "the event's dead letters, each with its feed")
	var tl uiapi.EventTimelineJSON
	c.get("/api/v1/events/"+shared.ID.String(), http.StatusOK, &tl)
	require.Len(t, tl.DeadLetters, 2, "the timeline shows both feeds' dead letters")
	var a0 uiapi.DeadLettersOfJSON
	c.get("/api/v1/dead-letters/"+shared.ID.String()+"?feed=a/0", http.StatusOK, &a0)
	require.Len(t, a0.DeadLetters, 1)
	require.Equal(t, "a/0", a0.DeadLetters[0].Feed)

	var res uiapi.ActionResult
	c.post("/api/v1/dead-letters/discard", `{"filter":{"feed":"a/0","key":"shared"},"dry_run":true}`, http.StatusOK, &res)
	require.Equal(t, []uiapi.LetterRef{{Feed: "a/0", ID: shared.ID.String()}}, res.Letters)
	c.post("/api/v1/dead-letters/discard", `{"filter":{"feed":"a/0","key":"shared"},"expect":1}`, http.StatusOK, &res)
	require.Equal(t, 1, res.Done)
	c.get("/api/v1/dead-letters/"+shared.ID.String()+"?feed=a/0", http.StatusNotFound, nil)
	var left uiapi.DeadLettersOfJSON
	c.get("/api/v1/dead-letters/"+shared.ID.String(), http.StatusOK, &left)
	require.Len(t, left.DeadLetters, 1, "b/0's dead letter of the same event stays")
	require.Equal(t, "b/0", left.DeadLetters[0].Feed)
	c.post("/api/v1/dead-letters/discard", `{"filter":{"feed":"a/0"},"dry_run":true}`, http.StatusOK, &res)
	require.Zero(t, res.Selected, "a/0 has none left: b/0's older letters are not taken in their place")
	c.post("/api/v1/dead-letters/discard", `{"filter":{"feed":"b"}}`, http.StatusOK, &res)
	require.Equal(t, 2, res.Done, "a feed's name: every partition of it")
	c.get("/api/v1/dead-letters/"+shared.ID.String(), http.StatusNotFound, nil)
}

func (s *suite) actionsByFilterGoPageByPage(t *testing.T) {
	ctx, store, plain2 := s.ctx, s.store, s.plain2
	c := &client{t: t, url: s.url}
	// Seven dead letters of topic "bulk" on their own feed, one with a
	// payload of 256 KiB and a reason of 64 KiB: a filter's action takes
	// a page at a time and says when more may match.
	lease, err := store.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/1", Holder: "suite", TTL: time.Minute})
	require.NoError(t, err)
	var bulk []*ferrydriver.DeadLetter
	for i := range 7 {
		ev := ferrydrivertest.Event("bulk", fmt.Sprintf("bulk-%d", i), "x")
		bulk = append(bulk, &ferrydriver.DeadLetter{Feed: "default/1", Event: *ev, Reason: "refused", FailedAt: time.Now().Add(time.Duration(i) * time.Millisecond)})
	}
	long := &bulk[0].Event
	long.Payload = bytes.Repeat([]byte(Hostile), 256<<10/len(Hostile)+1)
	bulk[0].Reason = strings.Repeat(Hostile, 64<<10/len(Hostile)+1)
	require.NoError(t, store.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: "default/1", Holder: "suite", Term: lease.Term, DeadLetters: bulk}))
	var of uiapi.DeadLettersOfJSON
	c.get("/api/v1/dead-letters/"+long.ID.String(), http.StatusOK, &of)
	dl := of.DeadLetters[0]
	require.NotNil(t, dl.Event.PayloadText)
	require.True(t, string(long.Payload) == *dl.Event.PayloadText, "a long payload reads back whole (%d bytes of %d)", len(*dl.Event.PayloadText), len(long.Payload))
	require.True(t, bulk[0].Reason == dl.Reason, "a long reason reads back whole (%d bytes of %d)", len(dl.Reason), len(bulk[0].Reason))

	var res uiapi.ActionResult
	c.post("/api/v1/dead-letters/discard", `{"filter":{"topic":"bulk","limit":3},"dry_run":true}`, http.StatusOK, &res)
	require.Equal(t, 3, res.Selected)
	require.True(t, res.More, "a full page: more may match")
	done := 0
	for page := 0; ; page++ {
		require.Less(t, page, 3, "three pages of 3 take 7")
		c.post("/api/v1/dead-letters/discard", `{"filter":{"topic":"bulk","limit":3}}`, http.StatusOK, &res)
		done += res.Done
		if !res.More {
			break
		}
	}
	require.Equal(t, 7, done)
	require.Equal(t, 1, res.Done, "the last page holds what was left")
	c.post("/api/v1/dead-letters/discard", `{"filter":{"topic":"bulk"},"dry_run":true}`, http.StatusOK, &res)
	require.Zero(t, res.Selected)
	require.False(t, res.More)
	c.post("/api/v1/dead-letters/discard", `{"letters":[{"feed":"default/0","id":"`+plain2.ID.String()+`"}],"dry_run":true}`, http.StatusOK, &res)
	require.False(t, res.More, "a selection of named dead letters is whole")
}

func (s *suite) failuresGroupByReason(t *testing.T) {
	ctx, store, inbox := s.ctx, s.store, s.inbox
	c := &client{t: t, url: s.url}
	// Feed default/2: three dead letters of one reason, two of a
	// hostile one, the newest last.
	lease, err := store.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/2", Holder: "suite", TTL: time.Minute})
	require.NoError(t, err)
	// One relay batch shares its failure time: one batch each, apart.
	var dls []*ferrydriver.DeadLetter
	for i, reason := range []string{"too large", "too large", Hostile, "too large", Hostile} {
		ev := ferrydrivertest.Event("reasons", fmt.Sprintf("r-%d", i), "x")
		dl := &ferrydriver.DeadLetter{Feed: "default/2", Event: *ev, Reason: reason, FailedAt: time.Now()}
		dls = append(dls, dl)
		require.NoError(t, store.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: "default/2", Holder: "suite", Term: lease.Term,
			DeadLetters: []*ferrydriver.DeadLetter{dl}}))
		time.Sleep(5 * time.Millisecond)
	}
	id := func(i int) string { return dls[i].Event.ID.String() }

	var out uiapi.ReasonsJSON
	body := c.get("/api/v1/dead-letters/reasons?feed=default/2", http.StatusOK, &out)
	require.NotContains(t, body, "<script>")
	require.Equal(t, 5, out.Scanned)
	require.Len(t, out.Reasons, 2)
	for i, want := range []struct {
		reason string
		ids    []string
	}{{"too large", []string{id(3), id(1), id(0)}}, {Hostile, []string{id(4), id(2)}}} {
		r := out.Reasons[i]
		require.Equal(t, want.reason, r.Reason)
		require.Equal(t, "default/2", r.Feed, "a reason's dead letters are of one feed partition")
		require.Equal(t, len(want.ids), r.Count)
		require.Equal(t, want.ids, r.IDs, "%s: newest first", want.reason)
		var dl uiapi.DeadLettersOfJSON
		c.get("/api/v1/dead-letters/"+want.ids[0], http.StatusOK, &dl)
		require.True(t, dl.DeadLetters[0].FailedAt.Equal(r.Latest), "%s: the latest is the newest's failure, %v, not %v", want.reason, dl.DeadLetters[0].FailedAt, r.Latest)
	}
	c.get("/api/v1/dead-letters/reasons?feed=default/2&scan=2", http.StatusOK, &out)
	require.Equal(t, 2, out.Scanned, "only the newest scan are read")
	require.Equal(t, 2, out.Scan)
	require.ElementsMatch(t, []int{1, 1}, []int{out.Reasons[0].Count, out.Reasons[1].Count})
	c.get("/api/v1/dead-letters/reasons?scan=0", http.StatusBadRequest, nil)

	// A reason's IDs are what an action takes.
	var res uiapi.ActionResult
	c.post("/api/v1/dead-letters/discard", `{"letters":[{"feed":"default/2","id":"`+id(4)+`"},{"feed":"default/2","id":"`+id(2)+`"}],"expect":2}`, http.StatusOK, &res)
	require.Equal(t, 2, res.Done)
	c.get("/api/v1/dead-letters/reasons?feed=default/2", http.StatusOK, &out)
	require.Len(t, out.Reasons, 1)
	require.Equal(t, "too large", out.Reasons[0].Reason)

	// A group's DEAD rows, by their last error.
	evs := []*ferryevent.Event{ferrydrivertest.Event("orders", "g-a", "1"), ferrydrivertest.Event("orders", "g-b", "2"), ferrydrivertest.Event("orders", "g-c", "3")}
	_, err = inbox.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "reasons", Events: evs})
	require.NoError(t, err)
	rows, err := inbox.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "reasons", Worker: "suite", Limit: 10, TTL: time.Minute, MaxAttempts: 10})
	require.NoError(t, err)
	require.Len(t, rows, 3)
	for _, row := range rows {
		why := "card declined"
		if row.Event.Key == "g-b" {
			why = Hostile
		}
		require.NoError(t, inbox.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "reasons", EventID: row.Event.ID, Claim: row.Claim, Error: why, Dead: true}))
	}
	body = c.get("/api/v1/groups/reasons/reasons", http.StatusOK, &out)
	require.NotContains(t, body, "<script>")
	require.Equal(t, 3, out.Scanned)
	require.Len(t, out.Reasons, 2)
	require.Equal(t, "card declined", out.Reasons[0].Reason)
	require.Equal(t, 2, out.Reasons[0].Count)
	require.ElementsMatch(t, []string{evs[0].ID.String(), evs[2].ID.String()}, out.Reasons[0].IDs)
	require.Equal(t, Hostile, out.Reasons[1].Reason)
	require.Equal(t, []string{evs[1].ID.String()}, out.Reasons[1].IDs)
}
