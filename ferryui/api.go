// Package ferryui is Ferry's web console and its admin HTTP API: what the
// relay and the consumer groups are doing, their dead letters, one event's
// path through them, and the actions an operator takes on them (redrive,
// discard, a group's dead policy). It works over the driver seams, so the
// same handler serves PostgreSQL, SQLite and MongoDB; `ferry ui` serves it.
// The console (at /) is a page and a script embedded in the package, built
// on the API (under /api/v1/) in the browser; it shows every value from an
// event as text, and its Content-Security-Policy runs no other script.
//
// Besides the backends' state, it shows what the relays and consumers did
// over time (GET /api/v1/activity): the samples each records in its store
// every interval (ferrydriver.Admin), summed per component.
//
// It is safe by default. It answers only requests addressed to it: the
// Host header an IP address, localhost or a name in Config.Hosts, so that
// a page of another site whose name it makes resolve to this machine (DNS
// rebinding) reaches nothing (403). Reads are GETs and need the token
// (Authorization: Bearer) unless Config.OpenReads; every action is a POST
// that needs the token, a JSON body (which a page of another origin cannot
// send without the browser asking first), and, when the request says
// where it comes from (Origin), the same host. A read-only handler refuses
// every action. The reads that open feeds on the database (an event looked
// for in the backlog) run two at a time, over at most 20,000 events. Every
// read reads O(page) rows:
// lists are capped (MaxPage), and relay dead letters and a group's
// finished events (dead, processed, discarded, retracted) page by a cursor
// (a list's "next", passed back as after=); a filter that no index serves
// (a type, a topic; a key over PROCESSED, DISCARDED or RETRACTED events) is
// matched over at most 10,000 rows from where the page starts (?scan=; the
// page says how many it read, and "next" reads on); a grouping by reason
// reads the newest failures only (10,000 unless ?scan= says otherwise); an
// event looked up by ID that is in no inbox and no dead letter is looked
// for in the first 4,000 unpublished events of the backlog (?scan=). An
// action by filter selects in the database, a page at a time, and acts on
// exactly what it selected: relay dead letters each by its feed and event,
// never another feed's.
package ferryui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

// MaxPage caps every list the API returns.
const MaxPage = 500

// DefaultPage is a list's length when the request names none.
const DefaultPage = 50

// Inbox is what the API needs of a consumer database: ferrydriver.Inbox
// without its transaction type (every driver's Inbox satisfies it).
type Inbox interface {
	ferrydriver.Admin
	ListInbox(ctx context.Context, p *ferrydriver.ListInboxParams) ([]*ferrydriver.InboxRow, error)
	RedriveInbox(ctx context.Context, p *ferrydriver.InboxIDsParams) (int, error)
	DiscardInbox(ctx context.Context, p *ferrydriver.InboxIDsParams) (int, error)
	InboxCounts(ctx context.Context, group string) (map[ferrydriver.InboxState]int64, error)
	SetInboxPolicy(ctx context.Context, p *ferrydriver.InboxPolicyParams) error
}

// Config configures a Handler.
type Config struct {
	// Store is the outbox's database (required).
	Store ferrydriver.Store
	// Inbox is the consumer groups' database; nil: no group views.
	Inbox Inbox
	// Feed names the relay feed from whose position an event that is
	// nowhere else is looked for in the backlog (its partitions are
	// Feed/0, Feed/1, …); empty means "default". The feeds list and the
	// parked keys show every feed the store knows of.
	Feed string
	// Groups are the consumer groups shown, added to those the backend
	// lists (ferrydriver.Admin).
	Groups []string
	// Token authorises actions and, unless OpenReads, reads
	// (Authorization: Bearer <Token>); it must be set unless the handler
	// is ReadOnly with OpenReads.
	Token string
	// ReadOnly refuses every action.
	ReadOnly bool
	// OpenReads serves the API's reads without the token. By default a
	// read needs it as an action does: events' payloads, keys and errors
	// are not for whoever reaches the port. The console's page and script
	// are served without it (the page asks for the token).
	OpenReads bool
	// Hosts are the names (a host, or host:port) the handler answers to
	// besides an IP address and localhost: a request whose Host header is
	// another name is refused (403). Give the names it is reached by (a
	// DNS name, a proxy's); "*" answers every name (behind a proxy that
	// checks them itself).
	Hosts []string
	// Chains reports the chain sources' cursors (ferrychain.ReadCursor,
	// which this package does not import); nil: no chain sources shown.
	Chains func(ctx context.Context) ([]uiapi.ChainJSON, error)
	// Logger records actions taken; nil discards.
	Logger *slog.Logger
}

// Handler serves the API under /api/v1/ and the web console at /.
type Handler struct {
	cfg Config
	mux *http.ServeMux
	log *slog.Logger
	// lookups holds a token per lookup of the backlog running.
	lookups chan struct{}
}

// New returns the API's handler.
func New(cfg *Config) (*Handler, error) {
	c := *cfg
	if c.Store == nil {
		return nil, errors.New("ferryui: Config.Store is nil: pass the outbox database's driver")
	}
	if c.Token == "" && !(c.ReadOnly && c.OpenReads) {
		return nil, errors.New("ferryui: Config.Token is empty: set a token for actions and reads (FERRY_UI_TOKEN for `ferry ui`), or ReadOnly with OpenReads")
	}
	if c.Feed == "" {
		c.Feed = "default"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: c, mux: http.NewServeMux(), log: c.Logger, lookups: make(chan struct{}, maxBacklogLookups)}
	for _, e := range h.endpoints() {
		if e.action {
			h.action(e.method+" "+e.path, e.fn)
		} else {
			h.route(e.method+" "+e.path, e.fn)
		}
	}
	h.routeConsole()
	h.handle("GET /api/v1/{$}", h.index)
	h.handle("/api/", func(w http.ResponseWriter, r *http.Request) error {
		return &apiError{http.StatusNotFound, "no such API path: " + r.URL.Path + " (GET /api/v1/ lists the API's paths)"}
	})
	return h, nil
}

// endpoint is one path of the API: GET reads, POST actions.
type endpoint struct {
	method, path, does string
	action             bool
	fn                 func(w http.ResponseWriter, r *http.Request) error
}

// endpoints are the API's paths, which GET /api/v1/ lists.
func (h *Handler) endpoints() []endpoint {
	read := func(path, does string, fn func(w http.ResponseWriter, r *http.Request) error) endpoint {
		return endpoint{method: "GET", path: path, does: does, fn: fn}
	}
	act := func(path, does string, fn func(w http.ResponseWriter, r *http.Request) error) endpoint {
		return endpoint{method: "POST", path: path, does: does, action: true, fn: fn}
	}
	return []endpoint{
		read("/api/v1/feeds", "every relay feed partition: lag, checkpoint, lease, dead letters (feed=)", h.feeds),
		read("/api/v1/dead-letters", "relay dead letters, newest first, a page at a time (feed=, key=, type=, topic=, reason=, since=, until=, limit=, after=, scan=)", h.deadLetters),
		read("/api/v1/dead-letters/reasons", "the newest relay dead letters grouped by feed and reason (feed=, scan=)", h.deadLetterReasons),
		read("/api/v1/dead-letters/{id}", "an event's relay dead letters, one per feed that dead-lettered it (feed=)", h.deadLetter),
		act("/api/v1/dead-letters/redrive", "send relay dead letters back to their feeds: {\"letters\": [{\"feed\", \"id\"}]} or {\"filter\": {...}}, dry_run, expect", h.deadLettersAction(true)),
		act("/api/v1/dead-letters/discard", "drop relay dead letters: as redrive", h.deadLettersAction(false)),
		read("/api/v1/groups", "the consumer groups: rows by state, dead policy", h.groups),
		read("/api/v1/groups/{group}/events", "a group's events of a state (state=, key=, type=, since=, until=, limit=, after=, scan=)", h.groupEvents),
		read("/api/v1/groups/{group}/reasons", "a group's newest dead events grouped by their last error (scan=)", h.groupReasons),
		act("/api/v1/groups/{group}/redrive", "run a group's dead events again: {\"ids\": [...]} or {\"filter\": {...}}, dry_run, expect", h.groupAction(true)),
		act("/api/v1/groups/{group}/discard", "drop a group's dead events: as redrive", h.groupAction(false)),
		act("/api/v1/groups/{group}/policy", "set a group's dead policy: {\"hold_dead\": true|false}", h.groupPolicy),
		read("/api/v1/events/{id}", "an event's timeline: dead letters, each group's row, or where it waits in the backlog (scan=)", h.event),
		read("/api/v1/parked", "the keys the relays parked or hold, and redriven dead letters waiting (limit=)", h.parked),
		read("/api/v1/keys/{key}", "where a key stands: parked, dead letters, each group's unfinished rows (limit=)", h.key),
		read("/api/v1/chains", "the chain sources' cursors", h.chains),
		read("/api/v1/activity", "what relays and consumers did over time (since=, kind=, name=)", h.activity),
	}
}

// index lists the API's paths, and what reads and actions need.
func (h *Handler) index(w http.ResponseWriter, r *http.Request) error {
	var out []uiapi.EndpointJSON
	for _, e := range h.endpoints() {
		out = append(out, uiapi.EndpointJSON{Method: e.method, Path: e.path, Does: e.does})
	}
	reads := "the token: Authorization: Bearer <token>"
	if h.cfg.OpenReads {
		reads = "nothing (open reads)"
	}
	actions := "the token, a JSON body, and no Origin of another site"
	if h.cfg.ReadOnly {
		actions = "nothing: this console is read-only, actions are refused"
	}
	writeJSON(w, http.StatusOK, map[string]any{"endpoints": out, "reads_need": reads, "actions_need": actions})
	return nil
}

// apiError is an error with its HTTP status; the message says what to do.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// route routes a read: the token unless OpenReads.
func (h *Handler) route(pattern string, fn func(w http.ResponseWriter, r *http.Request) error) {
	h.handle(pattern, func(w http.ResponseWriter, r *http.Request) error {
		if !h.cfg.OpenReads {
			if err := h.checkToken(r, "a read"); err != nil {
				return err
			}
		}
		return fn(w, r)
	})
}

// handle serves pattern with fn, writing its error as JSON.
func (h *Handler) handle(pattern string, fn func(w http.ResponseWriter, r *http.Request) error) {
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if err := fn(w, r); err != nil {
			var ae *apiError
			status := http.StatusInternalServerError
			if errors.As(err, &ae) {
				status = ae.status
			} else {
				h.log.Error("ferryui: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeJSON(w, status, map[string]string{"error": err.Error()})
		}
	})
}

// action routes an action: the token, a JSON body, and the same origin.
// The path answers other methods with 405: no action by GET (a GET pattern
// of a wider path, /dead-letters/{id}, would take it otherwise).
func (h *Handler) action(pattern string, fn func(w http.ResponseWriter, r *http.Request) error) {
	path := strings.TrimPrefix(pattern, "POST ")
	h.mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "an action is a POST, never a GET: " + path})
	})
	h.handle(pattern, func(w http.ResponseWriter, r *http.Request) error {
		if err := h.authorise(r); err != nil {
			return err
		}
		return fn(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // HTML-escapes <, > and &: safe to show in a page as it is
}

func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("the request body is not the JSON this action takes: %v", err)
	}
	return nil
}

func eventJSON(ev *ferryevent.Event) uiapi.EventJSON {
	out := uiapi.EventJSON{ID: ev.ID.String(), Topic: ev.Topic, Key: ev.Key, Seq: ev.Seq, Type: ev.Type, Source: ev.Source,
		ContentType: ev.ContentType, Headers: ev.Headers, CreatedAt: ev.CreatedAt, Payload: ev.Payload}
	if ev.Payload == nil {
		out.Payload = []byte{}
	}
	if utf8.Valid(ev.Payload) {
		s := string(ev.Payload)
		out.PayloadText = &s
	}
	return out
}

func filterFromQuery(q url.Values) (uiapi.Filter, error) {
	f := uiapi.Filter{Feed: q.Get("feed"), Key: q.Get("key"), Type: q.Get("type"), Topic: q.Get("topic"), Reason: q.Get("reason")}
	for _, t := range []struct {
		name string
		to   *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(t.name); v != "" {
			at, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return f, badRequest("%s=%q is not a time: use RFC 3339, as in 2026-12-02T10:00:00Z", t.name, v)
			}
			*t.to = at
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return f, badRequest("limit=%q is not a count: use 1 to %d", v, MaxPage)
		}
		f.Limit = n
	}
	return f, checkFilter(&f)
}

func checkFilter(f *uiapi.Filter) error {
	if f.Limit < 0 {
		return badRequest("limit %d is not a count: use 1 to %d", f.Limit, MaxPage)
	}
	if f.Limit > MaxPage {
		return badRequest("limit %d is over the API's page of %d: ask for the next page with after= (the list's \"next\")", f.Limit, MaxPage)
	}
	if f.Limit == 0 {
		f.Limit = DefaultPage
	}
	return nil
}

func pathID(r *http.Request) (uuid.UUID, error) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		return uuid.Nil, badRequest("%q is not an event ID: use the UUID the event was emitted with", r.PathValue("id"))
	}
	return id, nil
}

// selection is what an action names or selects: for a group, events
// (Feed ""); for the relay, dead letters.
type selection = []ferrydriver.DeadLetterRef

// named reads the request's IDs or Letters (the one the action takes:
// letters for relay dead letters), or checks its filter.
func named(a *uiapi.ActionRequest, letters bool) (selection, error) {
	what, other := `"ids"`, len(a.Letters) > 0
	if letters {
		what, other = `"letters"`, len(a.IDs) > 0
	}
	switch {
	case other && letters:
		return nil, badRequest(`name each relay dead letter with its feed: "letters": [{"feed": "hooks/0", "id": "<event ID>"}] (an event dead-lettered by several feeds has a dead letter in each), or use "filter"`)
	case other:
		return nil, badRequest(`a group's events are named by "ids" (event IDs), not "letters"`)
	}
	n := len(a.IDs) + len(a.Letters)
	if (n == 0) == (a.Filter == nil) {
		return nil, badRequest("name what to act on: either %s or \"filter\" (not both)", what)
	}
	if n > MaxPage {
		return nil, badRequest("%d events are over an action's %d: act in pages", n, MaxPage)
	}
	out := make(selection, 0, n)
	for i, s := range a.IDs {
		id, err := uuid.Parse(s)
		if err != nil {
			return nil, badRequest("ids[%d] = %q is not an event ID", i, s)
		}
		out = append(out, ferrydriver.DeadLetterRef{EventID: id})
	}
	for i, l := range a.Letters {
		id, err := uuid.Parse(l.ID)
		if err != nil || l.Feed == "" {
			return nil, badRequest("letters[%d] = {feed %q, id %q} is not a dead letter: give the feed partition that dead-lettered it and the event ID", i, l.Feed, l.ID)
		}
		out = append(out, ferrydriver.DeadLetterRef{Feed: l.Feed, EventID: id})
	}
	if a.Filter != nil {
		if err := checkFilter(a.Filter); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func expected(a *uiapi.ActionRequest, n int) error {
	if a.Expect != nil && *a.Expect != n {
		return &apiError{http.StatusConflict, fmt.Sprintf("the selection now holds %d event(s), not the %d expected: look again (dry_run) and confirm the new count", n, *a.Expect)}
	}
	return nil
}

func idStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// act runs an action: it selects what it acts on (choose, from what the
// request names or its filter), checks the count against Expect and,
// unless it is a dry run, acts on exactly that (do) and logs what it did.
// letters: the action takes relay dead letters, each named by its feed.
func (h *Handler) act(w http.ResponseWriter, r *http.Request, what string, letters bool,
	choose func(ctx context.Context, named selection, f *uiapi.Filter) (selected selection, more bool, err error),
	do func(ctx context.Context, selected selection) (int, error)) error {
	var req uiapi.ActionRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	named, err := named(&req, letters)
	if err != nil {
		return err
	}
	selected, more, err := choose(r.Context(), named, req.Filter)
	if err != nil {
		return err
	}
	if err := expected(&req, len(selected)); err != nil {
		return err
	}
	res := uiapi.ActionResult{Selected: len(selected), IDs: make([]string, len(selected)), DryRun: req.DryRun, More: more}
	for i, s := range selected {
		res.IDs[i] = s.EventID.String()
		if letters {
			res.Letters = append(res.Letters, uiapi.LetterRef{Feed: s.Feed, ID: s.EventID.String()})
		}
	}
	if !req.DryRun && len(selected) > 0 {
		if res.Done, err = do(r.Context(), selected); err != nil {
			return err
		}
		h.log.Info("ferryui: "+what, "count", res.Done, "remote", r.RemoteAddr)
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// maxReasonScan bounds ?scan= of a grouping by reason.
const maxReasonScan = 100_000

func (h *Handler) reasons(w http.ResponseWriter, r *http.Request, group func(ferrydriver.Admin, context.Context, *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error), rg ferrydriver.Admin, p *ferrydriver.ReasonsParams) error {
	p.Scan, p.IDs = ferrydriver.DefaultReasonScan, MaxPage
	if v := r.URL.Query().Get("scan"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxReasonScan {
			return badRequest("scan=%q is not a count of rows to read: use 1 to %d (default %d)", v, maxReasonScan, ferrydriver.DefaultReasonScan)
		}
		p.Scan = n
	}
	res, err := group(rg, r.Context(), p)
	if err != nil {
		return err
	}
	out := uiapi.ReasonsJSON{Reasons: make([]uiapi.ReasonJSON, len(res.Groups)), Scanned: res.Scanned, Scan: p.Scan}
	for i, g := range res.Groups {
		out.Reasons[i] = uiapi.ReasonJSON{Feed: g.Feed, Reason: g.Reason, Count: g.Count, Latest: g.Latest, IDs: idStrings(g.EventIDs)}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
