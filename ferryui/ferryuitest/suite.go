// Package ferryuitest is the admin API's conformance suite: every endpoint,
// its refusals, and hostile values, run against a backend's store and
// inbox. Each driver's tests run it (PostgreSQL in ferryui, SQLite in
// ferrysqlite, MongoDB in ferrymongo when a server is given).
package ferryuitest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
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
	InsertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams) ([]bool, error)
	ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error)
	FailInbox(ctx context.Context, p *ferrydriver.FailInboxParams) error
	RetractInbox(ctx context.Context, p *ferrydriver.RetractInboxParams) ([]ferrydriver.InboxState, error)
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
	lease, err := store.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "suite", TTL: time.Minute})
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
	var empty uiapi.ActivityJSON
	c.get("/api/v1/activity", http.StatusOK, &empty)
	require.True(t, empty.Recorded)
	at := time.Now().Add(-time.Minute).UTC()
	// Two relay processes in one step, summed; a group's one.
	require.NoError(t, store.RecordActivity(ctx, &ferrydriver.RecordActivityParams{Samples: []*ferrydriver.ActivitySample{
		{Kind: ferrydriver.ActivityRelay, Name: "default/0", Process: "r1", At: at, Interval: 10 * time.Second, Done: 100, Failed: 4,
			LatencyP50: 10 * time.Millisecond, LatencyP99: 20 * time.Millisecond, LagEvents: 1200, LagAge: 3 * time.Second},
		{Kind: ferrydriver.ActivityRelay, Name: "default/0", Process: "r2", At: at, Interval: 10 * time.Second, Done: 50, Dead: 1,
			LatencyP50: 40 * time.Millisecond, LatencyP99: 90 * time.Millisecond},
	}}))
	require.NoError(t, inbox.RecordActivity(ctx, &ferrydriver.RecordActivityParams{Samples: []*ferrydriver.ActivitySample{
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
