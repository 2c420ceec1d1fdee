// Package ferryuitest is the admin API's conformance suite: every endpoint,
// its refusals, and hostile values, run against a backend's store and
// inbox. Each driver's tests run it (PostgreSQL in ferryui, SQLite in
// ferrysqlite, MongoDB in ferrymongo when a server is given).
package ferryuitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryui"
)

// Inbox is what the suite needs of a consumer database: what the API reads
// and what the suite seeds it with.
type Inbox interface {
	ferryui.Inbox
	InsertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams) (*ferrydriver.InsertInboxResult, error)
	ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error)
	FailInbox(ctx context.Context, p *ferrydriver.FailInboxParams) error
	RetractInbox(ctx context.Context, p *ferrydriver.RetractInboxParams) (*ferrydriver.RetractInboxResult, error)
}

// Token is the suite's console token.
const Token = "suite-token"

// Hostile is a payload and key that a page must show as text.
const Hostile = `<script>alert("ferry")</script>' onmouseover="x`

// Run runs the suite on a migrated, empty store and inbox (the same
// database or two).
func Run(t *testing.T, store ferrydriver.Store, inbox Inbox) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := ferryui.New(&ferryui.Config{Store: store, Inbox: inbox, Token: Token})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	// Seed: three relay dead letters (one hostile) on feed default/0, and
	// a group "billing" with two DEAD events and a pending one.
	lease, err := store.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: "default/0", Holder: "suite", TTL: time.Minute})
	require.NoError(t, err)
	hostile := ferrydrivertest.Event("orders", Hostile, Hostile)
	hostile.Headers = map[string]string{"x-note": Hostile}
	plain1, plain2 := ferrydrivertest.Event("orders", "k1", "one"), ferrydrivertest.Event("invoices", "k2", "two")
	binary := ferrydrivertest.Event("orders", "k3", "")
	binary.Payload = []byte{0xff, 0x00, 0xfe}
	var dls []*ferrydriver.DeadLetter
	for i, ev := range []*ferryevent.Event{hostile, plain1, plain2, binary} {
		dls = append(dls, &ferrydriver.DeadLetter{Feed: "default/0", Event: *ev, Reason: "refused: " + Hostile, FailedAt: time.Now().Add(time.Duration(i-10) * time.Second)})
	}
	require.NoError(t, store.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: "default/0", Holder: "suite", Term: lease.Term, DeadLetters: dls}))

	require.NoError(t, inbox.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: "billing", HoldDead: true}))
	dead1, dead2, pending := ferrydrivertest.Event("orders", "a", Hostile), ferrydrivertest.Event("orders", "b", "b"), ferrydrivertest.Event("orders", "c", "c")
	_, err = inbox.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "billing", Events: []*ferryevent.Event{dead1, dead2}})
	require.NoError(t, err)
	rows, err := inbox.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "billing", Worker: "suite", Limit: 10, TTL: time.Minute, MaxAttempts: 10})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	for _, row := range rows {
		require.NoError(t, inbox.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "billing", EventID: row.Event.ID, Claim: row.Claim, Error: "handler: " + Hostile, Dead: true}))
	}
	_, err = inbox.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "billing", Events: []*ferryevent.Event{pending}})
	require.NoError(t, err)

	s := &suite{url: srv.URL, ctx: ctx, store: store, inbox: inbox, lease: lease, hostile: hostile, plain1: plain1, plain2: plain2, binary: binary, dls: dls, dead1: dead1, dead2: dead2, pending: pending}
	t.Run("TheConsoleIsServedLockedDown", s.theConsoleIsServedLockedDown)
	t.Run("Activity", s.activity)
	t.Run("Feeds", s.feeds)
	t.Run("DeadLettersArePagedAndShownExactly", s.deadLettersArePagedAndShownExactly)
	t.Run("BadRequestsSayWhatToDo", s.badRequestsSayWhatToDo)
	t.Run("TheAPIListsItsPaths", s.theAPIListsItsPaths)
	t.Run("OnlyItsOwnHostAndTheTokenAreAnswered", s.onlyItsOwnHostAndTheTokenAreAnswered)
	t.Run("ActionsNeedTheTokenJSONAndTheSameOrigin", s.actionsNeedTheTokenJSONAndTheSameOrigin)
	t.Run("RedriveAndDiscardDeadLetters", s.redriveAndDiscardDeadLetters)
	t.Run("ActionsByFilterStayInTheirFeed", s.actionsByFilterStayInTheirFeed)
	t.Run("ActionsByFilterGoPageByPage", s.actionsByFilterGoPageByPage)
	t.Run("FailuresGroupByReason", s.failuresGroupByReason)
	t.Run("GroupsAndTheirEvents", s.groupsAndTheirEvents)
	t.Run("GroupActions", s.groupActions)
	t.Run("EventTimeline", s.eventTimeline)
	t.Run("WhereAKeyStands", s.whereAKeyStands)
	t.Run("EveryFeedIsListed", s.everyFeedIsListed)
}

// suite is the seeded store and inbox the subtests share, in order: a
// subtest may act on what an earlier one left.
type suite struct {
	url     string
	ctx     context.Context
	store   ferrydriver.Store
	inbox   Inbox
	lease   *ferrydriver.Lease
	hostile *ferryevent.Event
	plain1  *ferryevent.Event
	plain2  *ferryevent.Event
	binary  *ferryevent.Event
	dls     []*ferrydriver.DeadLetter
	dead1   *ferryevent.Event
	dead2   *ferryevent.Event
	pending *ferryevent.Event
}

func (s *suite) theConsoleIsServedLockedDown(t *testing.T) {

	for path, kind := range map[string]string{"/": "text/html", "/console/console.js": "text/javascript", "/console/console.css": "text/css"} {
		resp, err := http.Get(s.url + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Contains(t, resp.Header.Get("Content-Type"), kind, path)
		require.NotEmpty(t, body, path)
		// Only the console's own script runs: no inline script, no other
		// origin, no framing.
		csp := resp.Header.Get("Content-Security-Policy")
		require.Contains(t, csp, "script-src 'self'", path)
		require.NotContains(t, csp, "unsafe-inline", path)
		require.Contains(t, csp, "frame-ancestors 'none'", path)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), path)
	}
	resp, err := http.Get(s.url + "/console/no-such-file.js")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func (s *suite) activity(t *testing.T) {
	ctx, store, inbox := s.ctx, s.store, s.inbox
	c := &client{t: t, url: s.url}
	rec, irec := store, inbox
	var empty uiapi.ActivityJSON
	c.get("/api/v1/activity", http.StatusOK, &empty)
	require.True(t, empty.Recorded)
	at := time.Now().Add(-time.Minute).UTC()
	// Two relay processes in one step, summed; a group's one.
	require.NoError(t, rec.RecordActivity(ctx, &ferrydriver.RecordActivityParams{Samples: []*ferrydriver.ActivitySample{
		{Kind: ferrydriver.ActivityRelay, Name: "default/0", Process: "r1", At: at, Interval: 10 * time.Second, Done: 100, Failed: 4,
			LatencyP50: 10 * time.Millisecond, LatencyP99: 20 * time.Millisecond, LagEvents: 1200, LagAge: 3 * time.Second},
		{Kind: ferrydriver.ActivityRelay, Name: "default/0", Process: "r2", At: at, Interval: 10 * time.Second, Done: 50, Dead: 1,
			LatencyP50: 40 * time.Millisecond, LatencyP99: 90 * time.Millisecond},
	}}))
	require.NoError(t, irec.RecordActivity(ctx, &ferrydriver.RecordActivityParams{Samples: []*ferrydriver.ActivitySample{
		{Kind: ferrydriver.ActivityConsumer, Name: Hostile, Process: "c1", At: at, Interval: 10 * time.Second, Done: 30, Failed: 2, Dead: 1,
			LatencyP50: 5 * time.Millisecond, LatencyP99: 9 * time.Millisecond, HandlerP50: time.Millisecond, HandlerP99: 3 * time.Millisecond},
	}}))
	var got uiapi.ActivityJSON
	c.get("/api/v1/activity?since=5m", http.StatusOK, &got)
	require.Equal(t, 10.0, got.StepSeconds, "5 minutes in steps of 10 s")
	require.Len(t, got.Series, 2)
	relay, group := got.Series[0], got.Series[1]
	require.Equal(t, [2]string{ferrydriver.ActivityRelay, "default/0"}, [2]string{relay.Kind, relay.Name})
	require.Len(t, relay.Points, 1)
	p := relay.Points[0]
	require.Equal(t, []int64{150, 4, 1}, []int64{p.Done, p.Failed, p.Dead})
	require.Equal(t, 2, p.Processes)
	require.InDelta(t, 15.0, p.DonePerSecond, 1e-9)
	require.InDelta(t, 0.4, p.FailedPerSecond, 1e-9)
	require.InDelta(t, 0.020, p.LatencyP50, 1e-6, "the processes' medians weighted by what each did")
	require.InDelta(t, 0.090, p.LatencyP99, 1e-6, "the largest p99")
	require.Equal(t, int64(150), relay.Total.Done)
	require.Equal(t, int64(1200), p.LagEvents, "the lag of the process that led")
	require.InDelta(t, 3.0, p.LagSeconds, 1e-6)
	require.Equal(t, int64(1200), relay.Total.LagEvents, "the last point's lag")
	require.Equal(t, [2]string{ferrydriver.ActivityConsumer, Hostile}, [2]string{group.Kind, group.Name})
	require.InDelta(t, 0.003, group.Points[0].HandlerP99, 1e-6)

	var relays uiapi.ActivityJSON
	c.get("/api/v1/activity?since=5m&kind=relay", http.StatusOK, &relays)
	require.Len(t, relays.Series, 1)
	var one uiapi.ActivityJSON
	c.get("/api/v1/activity?since=5m&name="+url.QueryEscape(Hostile), http.StatusOK, &one)
	require.Len(t, one.Series, 1)
	var recent uiapi.ActivityJSON
	c.get("/api/v1/activity?since=30s", http.StatusOK, &recent)
	require.Empty(t, recent.Series, "the samples are a minute old")
	var day uiapi.ActivityJSON
	c.get("/api/v1/activity?since=24h", http.StatusOK, &day)
	require.Equal(t, 480.0, day.StepSeconds, "a day in at most 180 steps")
	for _, bad := range []string{"since=yesterday", "since=48h", "kind=sink", "since=" + url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))} {
		var e struct{ Error string }
		c.get("/api/v1/activity?"+bad, http.StatusBadRequest, &e)
		require.NotEmpty(t, e.Error, bad)
	}
}

func (s *suite) feeds(t *testing.T) {
	c := &client{t: t, url: s.url}
	var out struct{ Feeds []uiapi.FeedJSON }
	c.get("/api/v1/feeds", http.StatusOK, &out)
	require.NotEmpty(t, out.Feeds)
	require.Equal(t, "default/0", out.Feeds[0].Feed)
	require.Equal(t, "suite", out.Feeds[0].LeaseHolder)
	require.True(t, out.Feeds[0].LeaseHeld)
	require.EqualValues(t, 4, out.Feeds[0].DeadLetters)
	var chains struct{ Chains []uiapi.ChainJSON }
	c.get("/api/v1/chains", http.StatusOK, &chains)
	require.NotNil(t, chains.Chains, "an empty list when no chain source is configured")
	require.Empty(t, chains.Chains)
}

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

func (s *suite) badRequestsSayWhatToDo(t *testing.T) {
	c := &client{t: t, url: s.url}
	for path, want := range map[string]string{
		"/api/v1/dead-letters/not-a-uuid":                "is not an event ID",
		"/api/v1/dead-letters/" + uuid.NewString():       "no relay dead letter",
		"/api/v1/dead-letters?limit=100000":              "ask for the next page with after=",
		"/api/v1/dead-letters?after=yesterday":           "is not a place in the list",
		"/api/v1/dead-letters?since=yesterday":           "use RFC 3339",
		"/api/v1/groups/billing/events?state=exploded":   "is not an inbox state",
		"/api/v1/events/" + uuid.NewString():             "not among the first 4000 unpublished events",
		"/api/v2/feeds":                                  "GET /api/v1/ lists the API's paths",
		"/api/v1/groups/billing/events?limit=-3":         "is not a count",
		"/api/v1/dead-letters?until=2026-13-40T00:00:00": "use RFC 3339",
	} {
		var e struct{ Error string }
		resp := c.do("GET", path, nil, Token, nil)
		require.GreaterOrEqual(t, resp.StatusCode, 400, path)
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e), path)
		resp.Body.Close()
		require.Contains(t, e.Error, want, path)
	}
}

func (s *suite) theAPIListsItsPaths(t *testing.T) {
	c := &client{t: t, url: s.url}
	var index struct {
		Endpoints   []uiapi.EndpointJSON
		ReadsNeed   string `json:"reads_need"`
		ActionsNeed string `json:"actions_need"`
	}
	resp := c.do("GET", "/api/v1/", nil, "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the index needs no token: it holds no data")
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&index))
	resp.Body.Close()
	paths := map[string]bool{}
	for _, e := range index.Endpoints {
		paths[e.Method+" "+e.Path] = true
		require.NotEmpty(t, e.Does, e.Path)
	}
	for _, p := range []string{"GET /api/v1/feeds", "GET /api/v1/dead-letters/{id}", "POST /api/v1/dead-letters/redrive", "GET /api/v1/events/{id}", "POST /api/v1/groups/{group}/policy"} {
		require.True(t, paths[p], "%s is listed: %v", p, paths)
	}
	require.Contains(t, index.ReadsNeed, "token")
}

func (s *suite) onlyItsOwnHostAndTheTokenAreAnswered(t *testing.T) {
	store, inbox, hostile := s.store, s.inbox, s.hostile
	c := &client{t: t, url: s.url}
	// A page of another site that has its name resolve to this
	// machine (DNS rebinding) sends its own name as the Host: refused,
	// pages and API alike, whatever the token.
	for _, path := range []string{"/api/v1/feeds", "/api/v1/events/" + hostile.ID.String(), "/", "/console/console.js"} {
		resp := c.do("GET", path, nil, Token, map[string]string{"Host": "rebound.example:9470"})
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode, path)
		require.Contains(t, string(body), "does not answer to host", path)
		require.Contains(t, string(body), "rebound.example:9470", path)
		require.Contains(t, string(body), "--ui-host rebound.example", path)
		require.NotContains(t, string(body), Hostile, path)
	}
	for _, host := range []string{"localhost:9470", "127.0.0.1", "[::1]:80"} {
		resp := c.do("GET", "/api/v1/feeds", nil, Token, map[string]string{"Host": host})
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, host)
	}
	// Reads need the token, as actions do.
	for _, token := range []string{"", "nope"} {
		resp := c.do("GET", "/api/v1/dead-letters/"+hostile.ID.String(), nil, token, nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "token %q", token)
		require.Contains(t, string(body), "a read needs the console's token")
		require.NotContains(t, string(body), Hostile)
	}
	resp := c.do("GET", "/", nil, "", nil)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the page itself needs no token: it asks for it")
	// A handler given its names answers them; "*" answers any;
	// OpenReads serves reads without the token.
	named, err := ferryui.New(&ferryui.Config{Store: store, Inbox: inbox, ReadOnly: true, OpenReads: true, Hosts: []string{"ferry.internal", "proxy.example:8443"}})
	require.NoError(t, err)
	for host, want := range map[string]int{"ferry.internal:9470": http.StatusOK, "FERRY.internal": http.StatusOK, "proxy.example:8443": http.StatusOK,
		"proxy.example:9470": http.StatusForbidden, "ferry.internal.evil.example": http.StatusForbidden, "": http.StatusForbidden} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/api/v1/feeds", nil)
		req.Host = host
		named.ServeHTTP(rec, req)
		require.Equal(t, want, rec.Code, "host %q", host)
	}
	every, err := ferryui.New(&ferryui.Config{Store: store, ReadOnly: true, OpenReads: true, Hosts: []string{"*"}})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/api/v1/feeds", nil)
	req.Host = "anything.example"
	every.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
}

func (s *suite) actionsNeedTheTokenJSONAndTheSameOrigin(t *testing.T) {
	store, inbox, plain1 := s.store, s.inbox, s.plain1
	c := &client{t: t, url: s.url}
	body := []byte(`{"letters":[{"feed":"default/0","id":"` + plain1.ID.String() + `"}]}`)
	for _, tc := range []struct {
		name, method, token, contentType, origin string
		status                                   int
	}{
		{"no token", "POST", "", "application/json", "", http.StatusUnauthorized},
		{"wrong token", "POST", "nope", "application/json", "", http.StatusUnauthorized},
		{"another origin", "POST", Token, "application/json", "http://evil.example", http.StatusForbidden},
		{"a form post", "POST", Token, "application/x-www-form-urlencoded", "", http.StatusUnsupportedMediaType},
		{"by GET", "GET", Token, "application/json", "", http.StatusMethodNotAllowed},
	} {
		resp := c.do(tc.method, "/api/v1/dead-letters/redrive", body, tc.token, map[string]string{"Content-Type": tc.contentType, "Origin": tc.origin})
		resp.Body.Close()
		require.Equal(t, tc.status, resp.StatusCode, tc.name)
	}
	var one uiapi.DeadLettersOfJSON
	c.get("/api/v1/dead-letters/"+plain1.ID.String(), http.StatusOK, &one) // untouched

	ro, err := ferryui.New(&ferryui.Config{Store: store, Inbox: inbox, ReadOnly: true, OpenReads: true})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/api/v1/dead-letters/redrive", bytes.NewReader(body))
	req.Host = "localhost"
	req.Header.Set("Authorization", "Bearer "+Token)
	req.Header.Set("Content-Type", "application/json")
	ro.ServeHTTP(rec, req)
	require.Equal(t, http.StatusForbidden, rec.Code)
	require.Contains(t, rec.Body.String(), "read-only")
	_, err = ferryui.New(&ferryui.Config{Store: store})
	require.ErrorContains(t, err, "Token is empty", "actions without a token are refused at construction")
	_, err = ferryui.New(&ferryui.Config{Store: store, ReadOnly: true})
	require.ErrorContains(t, err, "Token is empty", "and so are reads, unless they are open")
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
		lease, err := store.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: feed, Holder: "suite", TTL: time.Minute})
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
	lease, err := store.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: "default/1", Holder: "suite", TTL: time.Minute})
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
	lease, err := store.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: "default/2", Holder: "suite", TTL: time.Minute})
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
	require.NoError(t, store.Append(ctx, &ferrydriver.AppendParams{Events: waiting}))
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
	require.Equal(t, first.Outbox.Event.Seq+2, last.Outbox.Event.Seq)
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

	pk := store
	parked := ferrydrivertest.Event("orders", "p", "parked")
	require.NoError(t, pk.ParkEvents(ctx, &ferrydriver.ParkEventsParams{Feed: "default/0", Holder: "suite", Term: lease.Term, Events: []*ferryevent.Event{parked}, Reason: "not acknowledged"}))
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

func (s *suite) everyFeedIsListed(t *testing.T) {
	c := &client{t: t, url: s.url}
	// Feeds a, b and default's partitions 1 and 2 have had leases and
	// dead letters (the subtests above): all are listed, not only
	// default's stored partitions.
	var out struct{ Feeds []uiapi.FeedJSON }
	c.get("/api/v1/feeds", http.StatusOK, &out)
	var names []string
	for _, f := range out.Feeds {
		names = append(names, f.Feed)
	}
	require.Equal(t, []string{"a/0", "b/0", "default/0", "default/1", "default/2"}, names)
	c.get("/api/v1/feeds?feed=default", http.StatusOK, &out)
	require.Len(t, out.Feeds, 3, "a feed's name: each of its partitions")
	c.get("/api/v1/feeds?feed=b/0", http.StatusOK, &out)
	require.Len(t, out.Feeds, 1)
	require.Equal(t, "b/0", out.Feeds[0].Feed)
}

type client struct {
	t   *testing.T
	url string
}

func (c *client) do(method, path string, body []byte, token string, headers map[string]string) *http.Response {
	c.t.Helper()
	req, err := http.NewRequest(method, c.url+path, bytes.NewReader(body))
	require.NoError(c.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range headers {
		switch {
		case v == "":
		case k == "Host":
			req.Host = v
		default:
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	return resp
}

func (c *client) read(resp *http.Response, status int, out any) string {
	c.t.Helper()
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err := buf.ReadFrom(resp.Body)
	require.NoError(c.t, err)
	require.Equal(c.t, status, resp.StatusCode, "%s %s: %s", resp.Request.Method, resp.Request.URL.Path, buf.String())
	require.True(c.t, strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"))
	if out != nil {
		require.NoError(c.t, json.Unmarshal(buf.Bytes(), out))
	}
	return buf.String()
}

func (c *client) get(path string, status int, out any) string {
	c.t.Helper()
	return c.read(c.do("GET", path, nil, Token, nil), status, out)
}

func (c *client) post(path, body string, status int, out any) string {
	c.t.Helper()
	return c.read(c.do("POST", path, []byte(body), Token, map[string]string{"Content-Type": "application/json"}), status, out)
}

// BenchPages are the places BenchmarkPages reads, in a store seeded at
// scale: a DEAD event of group billing (its timeline), an event the relay
// has not published and that is found after the default scan of every
// partition before its own, a cursor deep in the relay's dead letters, a
// key with dead letters and inbox rows.
type BenchPages struct {
	DeadEvent, Waiting, DeepCursor, Key string
}

// BenchmarkPages times, through HTTP, every API call the console makes on
// a store and inbox seeded at scale (each backend seeds its own), and one
// event that is nowhere (a walk of the backlog's default scan). Each
// sub-benchmark reports ms/call.
func BenchmarkPages(b *testing.B, store ferrydriver.Store, inbox ferryui.Inbox, at BenchPages) {
	h, err := ferryui.New(&ferryui.Config{Store: store, Inbox: inbox, ReadOnly: true, OpenReads: true})
	require.NoError(b, err)
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	for _, c := range []struct {
		name, path string
		status     int
	}{
		{"feeds", "/api/v1/feeds", 0},
		{"dead-letters/first-page", "/api/v1/dead-letters", 0},
		{"dead-letters/deep-page", "/api/v1/dead-letters?after=" + url.QueryEscape(at.DeepCursor), 0},
		{"dead-letters/page-of-500", "/api/v1/dead-letters?limit=500", 0},
		{"dead-letters/by-type", "/api/v1/dead-letters?type=NoSuchType", 0},
		{"groups", "/api/v1/groups", 0},
		{"group-dead-events", "/api/v1/groups/billing/events?state=dead&limit=500", 0},
		{"group-pending-events", "/api/v1/groups/billing/events?state=pending&limit=500", 0},
		{"group-processed-events", "/api/v1/groups/billing/events?state=processed&limit=500", 0},
		{"group-processed-by-type", "/api/v1/groups/billing/events?state=processed&type=NoSuchType", 0},
		{"dead-letters/reasons", "/api/v1/dead-letters/reasons", 0},
		{"group-dead-reasons", "/api/v1/groups/billing/reasons", 0},
		{"event-timeline", "/api/v1/events/" + at.DeadEvent, 0},
		{"event-in-the-backlog", "/api/v1/events/" + at.Waiting, 0},
		{"event-nowhere", "/api/v1/events/" + uuid.NewString(), http.StatusNotFound},
		{"key", "/api/v1/keys/" + url.PathEscape(at.Key), 0},
		{"parked", "/api/v1/parked", 0},
		{"activity", "/api/v1/activity?since=1h", 0},
		{"console-page", "/", 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				resp, err := http.Get(srv.URL + c.path)
				require.NoError(b, err)
				_, err = io.Copy(io.Discard, resp.Body)
				require.NoError(b, err)
				resp.Body.Close()
				want := c.status
				if want == 0 {
					want = http.StatusOK
				}
				require.Equal(b, want, resp.StatusCode, c.path)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/call")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchOutboxSize is the outbox's size for BenchmarkPages' seeds:
// FERRY_BENCH_OUTBOX, or 1,000,000.
func BenchOutboxSize(b *testing.B) int {
	v := os.Getenv("FERRY_BENCH_OUTBOX")
	if v == "" {
		return 1_000_000
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, "FERRY_BENCH_OUTBOX=%q is not a count of events", v)
	return n
}
