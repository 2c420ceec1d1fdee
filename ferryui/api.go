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
// every interval (ferrydriver.ActivityRecorder), summed per component.
//
// It is safe by default: reads are GETs and every action is a POST that
// needs the token (Authorization: Bearer), a JSON body (which a page of
// another origin cannot send without the browser asking first), and, when
// the request says where it comes from (Origin), the same host. A
// read-only handler refuses every action. Every read reads O(page) rows:
// lists are capped (MaxPage), and relay dead letters and a group's
// finished events (dead, processed, discarded, retracted) page by a cursor
// (a list's "next", passed back as after=); a filter that no index serves
// (a type, a topic; a key over PROCESSED, DISCARDED or RETRACTED events) is
// matched over at most 10,000 rows from where the page starts (?scan=; the
// page says how many it read, and "next" reads on); a grouping by reason
// reads the newest failures only (10,000 unless ?scan= says otherwise); an
// event looked up by ID that is in no inbox and no dead letter is looked
// for in the first 4,000 unpublished events of the backlog (?scan=). An
// action by filter selects in the database, a page at a time.
package ferryui

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
)

// MaxPage caps every list the API returns.
const MaxPage = 500

// DefaultPage is a list's length when the request names none.
const DefaultPage = 50

// Inbox is what the API needs of a consumer database: ferrydriver.Inbox
// without its transaction type (every driver's Inbox satisfies it).
type Inbox interface {
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
	// Feed names the relay's feed (its partitions are Feed/0, Feed/1, …);
	// empty means "default".
	Feed string
	// Groups are the consumer groups shown, added to those the backend
	// lists (ferrydriver.GroupLister).
	Groups []string
	// Token authorises actions; it must be set unless ReadOnly.
	Token string
	// ReadOnly refuses every action.
	ReadOnly bool
	// Chains reports the chain sources' cursors (ferrychain.ReadCursor,
	// which this package does not import); nil: no chain sources shown.
	Chains func(ctx context.Context) ([]ChainJSON, error)
	// Logger records actions taken; nil discards.
	Logger *slog.Logger
}

// Handler serves the API under /api/v1/ and the web console at /.
type Handler struct {
	cfg Config
	mux *http.ServeMux
	log *slog.Logger
}

// New returns the API's handler.
func New(cfg *Config) (*Handler, error) {
	c := *cfg
	if c.Store == nil {
		return nil, errors.New("ferryui: Config.Store is nil: pass the outbox database's driver")
	}
	if c.Token == "" && !c.ReadOnly {
		return nil, errors.New("ferryui: Config.Token is empty: set a token for actions (FERRY_UI_TOKEN for `ferry ui`), or ReadOnly")
	}
	if c.Feed == "" {
		c.Feed = "default"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: c, mux: http.NewServeMux(), log: c.Logger}
	h.route("GET /api/v1/feeds", h.feeds)
	h.route("GET /api/v1/dead-letters", h.deadLetters)
	h.route("GET /api/v1/dead-letters/reasons", h.deadLetterReasons)
	h.route("GET /api/v1/dead-letters/{id}", h.deadLetter)
	h.action("POST /api/v1/dead-letters/redrive", h.deadLettersAction(true))
	h.action("POST /api/v1/dead-letters/discard", h.deadLettersAction(false))
	h.route("GET /api/v1/groups", h.groups)
	h.route("GET /api/v1/groups/{group}/events", h.groupEvents)
	h.route("GET /api/v1/groups/{group}/reasons", h.groupReasons)
	h.action("POST /api/v1/groups/{group}/redrive", h.groupAction(true))
	h.action("POST /api/v1/groups/{group}/discard", h.groupAction(false))
	h.action("POST /api/v1/groups/{group}/policy", h.groupPolicy)
	h.route("GET /api/v1/events/{id}", h.event)
	h.route("GET /api/v1/parked", h.parked)
	h.route("GET /api/v1/keys/{key}", h.key)
	h.route("GET /api/v1/chains", h.chains)
	h.route("GET /api/v1/activity", h.activity)
	h.routeConsole()
	h.route("/api/", func(w http.ResponseWriter, r *http.Request) error {
		return &apiError{http.StatusNotFound, "no such API path: " + r.URL.Path + " (the API is under /api/v1/)"}
	})
	return h, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// apiError is an error with its HTTP status; the message says what to do.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func (h *Handler) route(pattern string, fn func(w http.ResponseWriter, r *http.Request) error) {
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
	h.route(pattern, func(w http.ResponseWriter, r *http.Request) error {
		if err := h.authorise(r); err != nil {
			return err
		}
		return fn(w, r)
	})
}

func (h *Handler) authorise(r *http.Request) error {
	if h.cfg.ReadOnly {
		return &apiError{http.StatusForbidden, "this console is read-only: actions are refused (start it without --read-only to allow them)"}
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(token), []byte(h.cfg.Token)) != 1 {
		return &apiError{http.StatusUnauthorized, "an action needs the console's token: send it as \"Authorization: Bearer <token>\" (FERRY_UI_TOKEN, or the one `ferry ui` printed at start)"}
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return &apiError{http.StatusForbidden, fmt.Sprintf("an action from origin %q is refused: only pages served by this console (host %s) may act", origin, r.Host)}
		}
	}
	if mt := strings.TrimSpace(strings.Split(r.Header.Get("Content-Type"), ";")[0]); mt != "application/json" {
		return &apiError{http.StatusUnsupportedMediaType, "an action's body must be JSON (Content-Type: application/json)"}
	}
	return nil
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

// EventJSON is an event as the API shows it. Payload is base64 (JSON's
// form of bytes); PayloadText is the payload again when it is UTF-8 text.
type EventJSON struct {
	ID          string            `json:"id"`
	Topic       string            `json:"topic"`
	Key         string            `json:"key"`
	Seq         int64             `json:"seq"`
	Type        string            `json:"type"`
	Source      string            `json:"source,omitempty"`
	ContentType string            `json:"content_type,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	Payload     []byte            `json:"payload"`
	PayloadText *string           `json:"payload_text,omitempty"`
}

func eventJSON(ev *ferryevent.Event) EventJSON {
	out := EventJSON{ID: ev.ID.String(), Topic: ev.Topic, Key: ev.Key, Seq: ev.Seq, Type: ev.Type, Source: ev.Source,
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

// DeadLetterJSON is a relay dead letter.
type DeadLetterJSON struct {
	Feed     string    `json:"feed"`
	Reason   string    `json:"reason"`
	FailedAt time.Time `json:"failed_at"`
	Event    EventJSON `json:"event"`
}

func deadLetterJSON(dl *ferrydriver.DeadLetter) DeadLetterJSON {
	return DeadLetterJSON{Feed: dl.Feed, Reason: dl.Reason, FailedAt: dl.FailedAt, Event: eventJSON(&dl.Event)}
}

// InboxRowJSON is an event in a consumer group's inbox.
type InboxRowJSON struct {
	Group         string     `json:"group"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error,omitempty"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	ReceivedAt    time.Time  `json:"received_at"`
	FinishedAt    *time.Time `json:"finished_at,omitempty"`
	Event         EventJSON  `json:"event"`
	// History is the row's failed attempts and redrives, oldest first
	// (ferrydriver.AttemptLister); only an event's timeline has it, and
	// only where the backend keeps it.
	History []AttemptJSON `json:"history,omitempty"`
}

// AttemptJSON is one entry of an inbox row's history: a failed attempt
// (state failed or dead, with its error) or a redrive (state pending).
type AttemptJSON struct {
	Attempt int       `json:"attempt"`
	State   string    `json:"state"`
	Error   string    `json:"error,omitempty"`
	At      time.Time `json:"at"`
}

func inboxRowJSON(r *ferrydriver.InboxRow) InboxRowJSON {
	out := InboxRowJSON{Group: r.Group, State: string(r.State), Attempts: r.Attempts, LastError: r.LastError, ReceivedAt: r.ReceivedAt, Event: eventJSON(&r.Event)}
	if !r.FinishedAt.IsZero() {
		out.FinishedAt = &r.FinishedAt
	}
	if r.State == ferrydriver.InboxFailed {
		out.NextAttemptAt = &r.NextAttemptAt
	}
	return out
}

// FeedJSON is one partition of the relay's feed.
type FeedJSON struct {
	Feed              string     `json:"feed"`
	LagEvents         int64      `json:"lag_events"`
	LagEstimated      bool       `json:"lag_estimated"`
	OldestPending     *time.Time `json:"oldest_pending,omitempty"`
	LagSeconds        float64    `json:"lag_seconds"`
	CheckpointAt      *time.Time `json:"checkpoint_at,omitempty"`
	CheckpointSeconds float64    `json:"checkpoint_age_seconds,omitempty"`
	CheckpointTerm    int64      `json:"checkpoint_term"`
	LeaseHolder       string     `json:"lease_holder,omitempty"`
	LeaseTerm         int64      `json:"lease_term,omitempty"`
	LeaseHeld         bool       `json:"lease_held"`
	DeadLetters       int64      `json:"dead_letters"`
	DeadLettersMore   bool       `json:"dead_letters_more,omitempty"`
	DatabaseNow       time.Time  `json:"database_now"`
}

// OpenTxJSON is an open database transaction (the feeds list's
// oldest_outbox_tx: the oldest that wrote to the outbox and has not
// committed; its events are published when it does).
type OpenTxJSON struct {
	PID         int       `json:"pid"`
	Started     time.Time `json:"started"`
	AgeSeconds  float64   `json:"age_seconds"`
	State       string    `json:"state,omitempty"`
	Application string    `json:"application,omitempty"`
}

func (h *Handler) feeds(w http.ResponseWriter, r *http.Request) error {
	names, err := h.partitionFeeds(r.Context())
	if err != nil {
		return err
	}
	out := make([]FeedJSON, 0, len(names))
	for p, name := range names {
		st, err := h.cfg.Store.FeedStatus(r.Context(), &ferrydriver.FeedStatusParams{Feed: name, Partition: p})
		if err != nil {
			return err
		}
		f := FeedJSON{Feed: name, LagEvents: st.LagEvents, LagEstimated: st.LagEstimated, DeadLetters: st.DeadLetters,
			DeadLettersMore: st.DeadLettersMore, DatabaseNow: st.Now, CheckpointTerm: st.Checkpoint.Term}
		if !st.OldestPending.IsZero() {
			f.OldestPending = &st.OldestPending
			f.LagSeconds = st.Now.Sub(st.OldestPending).Seconds()
		}
		if st.Checkpoint.Cursor != nil {
			f.CheckpointAt = &st.Checkpoint.UpdatedAt
			f.CheckpointSeconds = st.Now.Sub(st.Checkpoint.UpdatedAt).Seconds()
		}
		if st.Lease != nil {
			f.LeaseHolder, f.LeaseTerm = st.Lease.Holder, st.Lease.Term
			f.LeaseHeld = st.Lease.ExpiresAt.After(st.Lease.Now)
		}
		out = append(out, f)
	}
	page := map[string]any{"feeds": out}
	// The oldest open transaction that wrote to the outbox (PostgreSQL):
	// its events go when it commits.
	if rep, ok := h.cfg.Store.(ferrydriver.OutboxTxReporter); ok {
		tx, err := rep.OldestOutboxTx(r.Context())
		if err != nil {
			return err
		}
		if tx != nil {
			page["oldest_outbox_tx"] = OpenTxJSON{PID: tx.PID, Started: tx.Started, AgeSeconds: tx.Now.Sub(tx.Started).Seconds(), State: tx.State, Application: tx.Application}
		}
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// Filter selects events by the fields that are set, failed (or finished)
// in [Since, Until).
type Filter struct {
	Feed  string    `json:"feed,omitempty"`
	Key   string    `json:"key,omitempty"`
	Type  string    `json:"type,omitempty"`
	Topic string    `json:"topic,omitempty"`
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	Limit int       `json:"limit,omitempty"`
}

func filterFromQuery(q url.Values) (Filter, error) {
	f := Filter{Feed: q.Get("feed"), Key: q.Get("key"), Type: q.Get("type"), Topic: q.Get("topic")}
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
	return f, f.check()
}

func (f *Filter) check() error {
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

func (h *Handler) deadLetters(w http.ResponseWriter, r *http.Request) error {
	f, err := filterFromQuery(r.URL.Query())
	if err != nil {
		return err
	}
	after, err := parseCursor(r.URL.Query().Get("after"))
	if err != nil {
		return err
	}
	scan, err := scanParam(r.URL.Query())
	if err != nil {
		return err
	}
	got, err := h.pageDeadLetters(r.Context(), f, after, f.Limit, scan)
	if err != nil {
		return err
	}
	items := make([]DeadLetterJSON, len(got.items))
	for i, dl := range got.items {
		items[i] = deadLetterJSON(dl)
	}
	page := map[string]any{"dead_letters": items}
	if got.next != nil {
		page["next"] = got.next.FailedAt.UTC().Format(time.RFC3339Nano) + "," + got.next.EventID.String()
	}
	if got.scanned > 0 {
		page["scanned"] = got.scanned
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// parseCursor reads a list's "next": where the next page starts.
func parseCursor(v string) (*ferrydriver.DeadLetterCursor, error) {
	if v == "" {
		return nil, nil
	}
	at, id, ok := strings.Cut(v, ",")
	t, terr := time.Parse(time.RFC3339Nano, at)
	u, uerr := uuid.Parse(id)
	if !ok || terr != nil || uerr != nil {
		return nil, badRequest("after=%q is not a place in the list: pass the \"next\" of the page before, as it is", v)
	}
	return &ferrydriver.DeadLetterCursor{FailedAt: t, EventID: u}, nil
}

func pathID(r *http.Request) (uuid.UUID, error) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		return uuid.Nil, badRequest("%q is not an event ID: use the UUID the event was emitted with", r.PathValue("id"))
	}
	return id, nil
}

func (h *Handler) deadLetter(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	dls, err := h.cfg.Store.ListDeadLetters(r.Context(), &ferrydriver.ListDeadLettersParams{EventIDs: []uuid.UUID{id}, Limit: 1})
	if err != nil {
		return err
	}
	if len(dls) == 0 {
		return &apiError{http.StatusNotFound, "no relay dead letter has event ID " + id.String()}
	}
	dl := dls[0]
	writeJSON(w, http.StatusOK, deadLetterJSON(dl))
	return nil
}

// ActionRequest selects what an action acts on: the events IDs, or every
// one matching Filter (at most Filter.Limit). DryRun counts them and acts
// on none; Expect, when set, makes the action refuse unless it would act
// on exactly that many (the count a dry run showed).
type ActionRequest struct {
	IDs    []string `json:"ids,omitempty"`
	Filter *Filter  `json:"filter,omitempty"`
	DryRun bool     `json:"dry_run,omitempty"`
	Expect *int     `json:"expect,omitempty"`
}

// ActionResult says how many events an action selected and acted on.
// An action by filter selects one page (the filter's limit, DefaultPage
// if none): More says the page was full, so more events may match; the
// same request again (a dry run to count, then the action) takes the next
// page, since the events acted on no longer match.
// The selection applies every filter in the database, the first matches
// however far back they are: a filter no index serves (a type, a topic)
// may read many rows to find them.
type ActionResult struct {
	Selected int      `json:"selected"`
	Done     int      `json:"done"`
	IDs      []string `json:"ids"`
	DryRun   bool     `json:"dry_run,omitempty"`
	More     bool     `json:"more"`
}

func (a *ActionRequest) ids() ([]uuid.UUID, error) {
	if (len(a.IDs) == 0) == (a.Filter == nil) {
		return nil, badRequest("name the events to act on: either \"ids\" or \"filter\" (not both)")
	}
	out := make([]uuid.UUID, len(a.IDs))
	for i, s := range a.IDs {
		id, err := uuid.Parse(s)
		if err != nil {
			return nil, badRequest("ids[%d] = %q is not an event ID", i, s)
		}
		out[i] = id
	}
	if len(out) > MaxPage {
		return nil, badRequest("%d IDs are over an action's %d: act in pages", len(out), MaxPage)
	}
	if a.Filter != nil {
		if err := a.Filter.check(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (a *ActionRequest) expected(n int) error {
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

// act runs an action: it selects the events (choose, from the request's
// IDs or filter), checks the count against Expect and, unless it is a dry
// run, acts on them (do) and logs what it did.
func (h *Handler) act(w http.ResponseWriter, r *http.Request, what string,
	choose func(ctx context.Context, ids []uuid.UUID, f *Filter) (selected []uuid.UUID, more bool, err error),
	do func(ctx context.Context, ids []uuid.UUID) (int, error)) error {
	var req ActionRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	ids, err := req.ids()
	if err != nil {
		return err
	}
	selected, more, err := choose(r.Context(), ids, req.Filter)
	if err != nil {
		return err
	}
	if err := req.expected(len(selected)); err != nil {
		return err
	}
	res := ActionResult{Selected: len(selected), IDs: idStrings(selected), DryRun: req.DryRun, More: more}
	if !req.DryRun && len(selected) > 0 {
		if res.Done, err = do(r.Context(), selected); err != nil {
			return err
		}
		h.log.Info("ferryui: "+what, "count", res.Done, "remote", r.RemoteAddr)
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (h *Handler) deadLettersAction(redrive bool) func(w http.ResponseWriter, r *http.Request) error {
	verb, act := "discarded", h.cfg.Store.DiscardDeadLetters
	if redrive {
		verb, act = "redriven", h.cfg.Store.RedriveDeadLetters
	}
	// An action by filter selects in the database, every filter applied
	// there: its page holds the first matches however far back they are
	// (an action is an operator's write, a page at a time, not a page the
	// console polls).
	choose := func(ctx context.Context, ids []uuid.UUID, f *Filter) ([]uuid.UUID, bool, error) {
		list := &ferrydriver.ListDeadLettersParams{EventIDs: ids, Limit: MaxPage}
		if f != nil {
			list = &ferrydriver.ListDeadLettersParams{Feed: f.Feed, Key: f.Key, Type: f.Type, Topic: f.Topic, Since: f.Since, Until: f.Until, Limit: f.Limit}
		}
		dls, err := h.cfg.Store.ListDeadLetters(ctx, list)
		if err != nil {
			return nil, false, err
		}
		out := make([]uuid.UUID, len(dls))
		for i, dl := range dls {
			out[i] = dl.Event.ID
		}
		return out, f != nil && len(dls) == f.Limit, nil
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		return h.act(w, r, "relay dead letters "+verb, choose, func(ctx context.Context, ids []uuid.UUID) (int, error) {
			return act(ctx, &ferrydriver.DeadLetterSelection{EventIDs: ids, Limit: len(ids)})
		})
	}
}

// GroupJSON is a consumer group: its inbox rows by state (each counted to
// ferrydriver.InboxCountCap) and its stored dead policy, "hold" (a key's
// later events wait behind a DEAD one: each DEAD event holds its key) or
// "continue"; "hold" too when none is stored (no consumer of the group
// has started), as consumers then hold.
type GroupJSON struct {
	Group      string           `json:"group"`
	Counts     map[string]int64 `json:"counts"`
	DeadPolicy string           `json:"dead_policy"`
}

// groupPolicies lists the groups, each with its stored policy (true:
// hold) when the inbox lists them, in name order.
func (h *Handler) groupPolicies(ctx context.Context) ([]ferrydriver.GroupPolicy, error) {
	hold := map[string]bool{}
	for _, g := range h.cfg.Groups {
		hold[g] = true
	}
	if gl, ok := h.cfg.Inbox.(ferrydriver.GroupLister); ok {
		listed, err := gl.InboxGroups(ctx)
		if err != nil {
			return nil, err
		}
		for _, g := range listed {
			hold[g.Group] = g.HoldDead
		}
	}
	out := make([]ferrydriver.GroupPolicy, 0, len(hold))
	for g, h := range hold {
		out = append(out, ferrydriver.GroupPolicy{Group: g, HoldDead: h})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out, nil
}

func policyName(hold bool) string {
	if hold {
		return "hold"
	}
	return "continue"
}

func (h *Handler) inbox() (Inbox, error) {
	if h.cfg.Inbox == nil {
		return nil, &apiError{http.StatusNotFound, "this console has no consumer database: give it one (--inbox-database-url, or the same database)"}
	}
	return h.cfg.Inbox, nil
}

func (h *Handler) groups(w http.ResponseWriter, r *http.Request) error {
	in, err := h.inbox()
	if err != nil {
		return err
	}
	groups, err := h.groupPolicies(r.Context())
	if err != nil {
		return err
	}
	out := make([]GroupJSON, 0, len(groups))
	for _, gp := range groups {
		g := gp.Group
		counts, err := in.InboxCounts(r.Context(), g)
		if err != nil {
			return err
		}
		c := map[string]int64{}
		for st, n := range counts {
			c[string(st)] = n
		}
		out = append(out, GroupJSON{Group: g, Counts: c, DeadPolicy: policyName(gp.HoldDead)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"groups": out, "count_cap": ferrydriver.InboxCountCap})
	return nil
}

func parseStates(v string) ([]ferrydriver.InboxState, error) {
	if v == "" {
		return []ferrydriver.InboxState{ferrydriver.InboxDead}, nil
	}
	var out []ferrydriver.InboxState
	for _, s := range strings.Split(v, ",") {
		st := ferrydriver.InboxState(strings.TrimSpace(s))
		if !st.Valid() {
			names := make([]string, len(ferrydriver.InboxStates))
			for i, n := range ferrydriver.InboxStates {
				names[i] = string(n)
			}
			return nil, badRequest("state=%q is not an inbox state: use %s (several, comma-separated)", s, strings.Join(names, ", "))
		}
		out = append(out, st)
	}
	return out, nil
}

func (h *Handler) groupEvents(w http.ResponseWriter, r *http.Request) error {
	in, err := h.inbox()
	if err != nil {
		return err
	}
	f, err := filterFromQuery(r.URL.Query())
	if err != nil {
		return err
	}
	states, err := parseStates(r.URL.Query().Get("state"))
	if err != nil {
		return err
	}
	after, err := parseInboxCursor(r.URL.Query().Get("after"))
	if err != nil {
		return err
	}
	scan, err := scanParam(r.URL.Query())
	if err != nil {
		return err
	}
	list := &ferrydriver.ListInboxParams{Group: r.PathValue("group"), States: states, Key: f.Key, Type: f.Type,
		Since: f.Since, Until: f.Until, Limit: f.Limit, After: after}
	if ferrydriver.CheckInboxCursor(list) != nil {
		return badRequest("after= pages lists of finished events only (state=dead, processed, discarded, retracted): ask for one of those")
	}
	got, err := pageInbox(r.Context(), in, *list, scan)
	if err != nil {
		return err
	}
	items := make([]InboxRowJSON, len(got.items))
	for i, row := range got.items {
		items[i] = inboxRowJSON(row)
	}
	groups, err := h.groupPolicies(r.Context())
	if err != nil {
		return err
	}
	hold := true // no stored policy: consumers hold
	for _, g := range groups {
		if g.Group == list.Group {
			hold = g.HoldDead
		}
	}
	page := map[string]any{"events": items, "dead_policy": policyName(hold)}
	if c := got.next; c != nil {
		page["next"] = c.FinishedAt.UTC().Format(time.RFC3339Nano) + "," + c.ReceivedAt.UTC().Format(time.RFC3339Nano) + "," + c.EventID.String()
	}
	if got.scanned > 0 {
		page["scanned"] = got.scanned
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// parseInboxCursor reads a group's list's "next": where its next page
// starts.
func parseInboxCursor(v string) (*ferrydriver.InboxCursor, error) {
	if v == "" {
		return nil, nil
	}
	parts := strings.Split(v, ",")
	if len(parts) == 3 {
		fin, ferr := time.Parse(time.RFC3339Nano, parts[0])
		rec, rerr := time.Parse(time.RFC3339Nano, parts[1])
		id, ierr := uuid.Parse(parts[2])
		if ferr == nil && rerr == nil && ierr == nil {
			return &ferrydriver.InboxCursor{FinishedAt: fin, ReceivedAt: rec, EventID: id}, nil
		}
	}
	return nil, badRequest("after=%q is not a place in the list: pass the \"next\" of the page before, as it is", v)
}

func (h *Handler) groupAction(redrive bool) func(w http.ResponseWriter, r *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		in, err := h.inbox()
		if err != nil {
			return err
		}
		group := r.PathValue("group")
		verb, act := "discarded", in.DiscardInbox
		if redrive {
			verb, act = "redriven", in.RedriveInbox
		}
		dead := []ferrydriver.InboxState{ferrydriver.InboxDead}
		choose := func(ctx context.Context, ids []uuid.UUID, f *Filter) ([]uuid.UUID, bool, error) {
			list := &ferrydriver.ListInboxParams{Group: group, States: dead, EventIDs: ids, Limit: MaxPage}
			if f != nil {
				list = &ferrydriver.ListInboxParams{Group: group, States: dead, Key: f.Key, Type: f.Type, Since: f.Since, Until: f.Until, Limit: f.Limit}
			}
			rows, err := in.ListInbox(ctx, list)
			if err != nil {
				return nil, false, err
			}
			out := make([]uuid.UUID, len(rows))
			for i, row := range rows {
				out[i] = row.Event.ID
			}
			return out, f != nil && len(rows) == f.Limit, nil
		}
		return h.act(w, r, "group "+group+": dead events "+verb, choose, func(ctx context.Context, ids []uuid.UUID) (int, error) {
			return act(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: ids})
		})
	}
}

// PolicyRequest sets a group's dead policy: true holds a key's later
// events behind a DEAD one (ferry.Hold), false lets them run (Continue).
type PolicyRequest struct {
	HoldDead *bool `json:"hold_dead"`
}

func (h *Handler) groupPolicy(w http.ResponseWriter, r *http.Request) error {
	in, err := h.inbox()
	if err != nil {
		return err
	}
	var req PolicyRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	if req.HoldDead == nil {
		return badRequest("set \"hold_dead\": true holds a key's later events behind a dead one, false lets them run")
	}
	group := r.PathValue("group")
	if err := in.SetInboxPolicy(r.Context(), &ferrydriver.InboxPolicyParams{Group: group, HoldDead: *req.HoldDead}); err != nil {
		return err
	}
	h.log.Info("ferryui: dead policy set", "group", group, "hold_dead", *req.HoldDead, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, map[string]any{"group": group, "hold_dead": *req.HoldDead})
	return nil
}

// EventTimelineJSON is what the console knows of one event: its relay dead
// letter, if it has one, and its row in each consumer group's inbox.
type EventTimelineJSON struct {
	ID         string          `json:"id"`
	DeadLetter *DeadLetterJSON `json:"dead_letter,omitempty"`
	Groups     []InboxRowJSON  `json:"groups"`
	// Outbox is set for an event the relay has not published yet, found
	// in its partition's backlog.
	Outbox *OutboxJSON `json:"outbox,omitempty"`
}

// OutboxJSON is where an event the relay has not published yet waits:
// the feed (partition) whose backlog holds it and how many events that
// feed reads before it from its checkpoint. Invalid, when set, is why the
// relay will dead-letter it instead of publishing it.
type OutboxJSON struct {
	Feed    string    `json:"feed"`
	Ahead   int       `json:"ahead"`
	Invalid string    `json:"invalid,omitempty"`
	Event   EventJSON `json:"event"`
}

// An event that is neither a dead letter nor in an inbox is looked for in
// the backlog: the outbox has no index on event IDs (one would cost every
// append), so the backlog is read the way the relay reads it, outboxScan
// events in all (?scan= up to maxOutboxScan), shared evenly among the
// partitions: the first 4,000 unpublished events of one partition, the
// first 1,000 of each of four: about 100-150 ms on PostgreSQL with a
// backlog of 1,000,000 events (BenchmarkPagesAtScale), most of it the
// feeds' opening.
const (
	outboxScan    = 4_000
	maxOutboxScan = 100_000
)

func (h *Handler) event(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	out := EventTimelineJSON{ID: id.String(), Groups: []InboxRowJSON{}}
	dls, err := h.cfg.Store.ListDeadLetters(r.Context(), &ferrydriver.ListDeadLettersParams{EventIDs: []uuid.UUID{id}, Limit: 1})
	if err != nil {
		return err
	}
	if len(dls) > 0 {
		dl := deadLetterJSON(dls[0])
		out.DeadLetter = &dl
	}
	if h.cfg.Inbox != nil {
		groups, err := h.groupPolicies(r.Context())
		if err != nil {
			return err
		}
		for _, gp := range groups {
			g := gp.Group
			rows, err := h.cfg.Inbox.ListInbox(r.Context(), &ferrydriver.ListInboxParams{Group: g, States: ferrydriver.InboxStates, EventIDs: []uuid.UUID{id}, Limit: 1})
			if err != nil {
				return err
			}
			for _, row := range rows {
				j := inboxRowJSON(row)
				if j.History, err = h.history(r.Context(), g, id); err != nil {
					return err
				}
				out.Groups = append(out.Groups, j)
			}
		}
	}
	if out.DeadLetter == nil && len(out.Groups) == 0 {
		scan := outboxScan
		if v := r.URL.Query().Get("scan"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxOutboxScan {
				return badRequest("scan=%q is not a count of events to read: use 1 to %d (default %d)", v, maxOutboxScan, outboxScan)
			}
			scan = n
		}
		var backlogErr error
		out.Outbox, backlogErr = h.unpublished(r.Context(), id, scan)
		if out.Outbox == nil {
			where := fmt.Sprintf("not among the first %d unpublished events of the outbox", scan)
			if backlogErr != nil {
				// The lookup is a courtesy: a feed that cannot be read here
				// (a partition count that changed, say) leaves it a 404.
				h.log.Warn("ferryui: reading the outbox's backlog for an event failed", "event", id, "err", backlogErr)
				where = "the outbox's backlog could not be read (" + backlogErr.Error() + ")"
			}
			return &apiError{http.StatusNotFound, fmt.Sprintf("event %s is not a relay dead letter, not in any consumer group's inbox, "+
				"and %s: it was published to a destination without a Ferry inbox, "+
				"its key is parked (GET /api/v1/parked), it is further back in the backlog (ask again with a larger scan=, up to %d), or no such event committed", id, where, maxOutboxScan)}
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// unpublished looks for an event in the backlog of each partition: the
// first scan/partitions events its feed reads from its checkpoint, read as
// the relay reads them (a feed of the store; nothing is written).
func (h *Handler) unpublished(ctx context.Context, id uuid.UUID, scan int) (*OutboxJSON, error) {
	feeds, err := h.partitionFeeds(ctx)
	if err != nil {
		return nil, err
	}
	// The partitions are read side by side, four at a time: opening a feed
	// and its first read cost 20-35 ms on PostgreSQL (a session of its own,
	// a snapshot, the transactions since the checkpoint), the events after
	// that about 5 µs each.
	found := make([]*OutboxJSON, len(feeds))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for p, name := range feeds {
		g.Go(func() error {
			f, err := h.findInFeed(gctx, name, p, id, max(1, scan/len(feeds)))
			found[p] = f
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for _, f := range found {
		if f != nil {
			return f, nil
		}
	}
	return nil, nil
}

func (h *Handler) findInFeed(ctx context.Context, name string, partition int, id uuid.UUID, scan int) (*OutboxJSON, error) {
	cp, err := h.cfg.Store.LoadCheckpoint(ctx, &ferrydriver.LoadCheckpointParams{Feed: name})
	if err != nil {
		return nil, err
	}
	f, err := h.cfg.Store.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: name + " (console)", Partition: partition, Cursor: cp.Cursor})
	if err != nil {
		return nil, fmt.Errorf("read the backlog of %s: %w", name, err)
	}
	defer f.Close()
	// A feed may return an empty batch where one window of its backlog
	// ends and the next begins (ferrypg's snapshots): two in a row are
	// the end.
	for read, empty := 0, 0; read < scan && empty < 2; {
		b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: min(scan-read, MaxPage)})
		if err != nil {
			return nil, fmt.Errorf("read the backlog of %s: %w", name, err)
		}
		for i, ev := range b.Events {
			if ev.ID == id {
				return &OutboxJSON{Feed: name, Ahead: read + i, Event: eventJSON(ev)}, nil
			}
		}
		for _, inv := range b.Invalid {
			if inv.Event.ID == id {
				return &OutboxJSON{Feed: name, Ahead: read + len(b.Events), Invalid: inv.Reason, Event: eventJSON(&inv.Event)}, nil
			}
		}
		n := len(b.Events) + len(b.Invalid)
		if n == 0 {
			empty++
		} else {
			empty = 0
		}
		read += n
	}
	return nil, nil
}

// history reads an event's history in a group, where the backend keeps
// one (ferrydriver.AttemptLister).
func (h *Handler) history(ctx context.Context, group string, id uuid.UUID) ([]AttemptJSON, error) {
	l, ok := h.cfg.Inbox.(ferrydriver.AttemptLister)
	if !ok {
		return nil, nil
	}
	entries, err := l.InboxAttempts(ctx, group, id)
	if err != nil {
		return nil, err
	}
	var out []AttemptJSON
	for _, e := range entries {
		out = append(out, AttemptJSON{Attempt: e.Attempt, State: string(e.State), Error: e.Error, At: e.At})
	}
	return out, nil
}

// ParkedJSON is a key the relay set aside because its destination stopped
// acknowledging it: its first parked event, and whether the relay gave up
// retrying it (held: `ferry parked release` or skip lets it go).
type ParkedJSON struct {
	Feed     string    `json:"feed"`
	Key      string    `json:"key"`
	Held     bool      `json:"held"`
	Reason   string    `json:"reason,omitempty"`
	ParkedAt time.Time `json:"parked_at"`
	Queued   int64     `json:"queued"`
	Event    EventJSON `json:"event"`
}

func parkedJSON(p *ferrydriver.ParkedEvent) ParkedJSON {
	return ParkedJSON{Feed: p.Feed, Key: p.Event.Key, Held: p.Held, Reason: p.Reason, ParkedAt: p.ParkedAt, Queued: p.Queued, Event: eventJSON(&p.Event)}
}

// partitionFeeds names the feed's partitions (Feed/0, Feed/1, ...).
func (h *Handler) partitionFeeds(ctx context.Context) ([]string, error) {
	n := 1
	if ps, ok := h.cfg.Store.(ferrydriver.PartitionStore); ok {
		stored, err := ps.StoredPartitions(ctx)
		if err != nil {
			return nil, err
		}
		n = stored
	}
	out := make([]string, n)
	for p := range n {
		out[p] = h.cfg.Feed + "/" + strconv.Itoa(p)
	}
	return out, nil
}

// parkedKeys returns the parked keys of the feed's partitions (all of them,
// at most limit per partition, when keys is nil).
func (h *Handler) parkedKeys(ctx context.Context, keys []string, limit int) ([]ParkedJSON, error) {
	out := []ParkedJSON{}
	pk, ok := h.cfg.Store.(ferrydriver.Parker)
	if !ok {
		return out, nil
	}
	feeds, err := h.partitionFeeds(ctx)
	if err != nil {
		return nil, err
	}
	for _, feed := range feeds {
		heads, err := pk.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed, Keys: keys, Limit: limit})
		if err != nil {
			return nil, err
		}
		for _, p := range heads {
			out = append(out, parkedJSON(p))
		}
	}
	return out, nil
}

// parked lists the keys the relay parked or holds, per partition: a page
// of each (limit, default DefaultPage).
func (h *Handler) parked(w http.ResponseWriter, r *http.Request) error {
	f, err := filterFromQuery(r.URL.Query())
	if err != nil {
		return err
	}
	out, err := h.parkedKeys(r.Context(), nil, f.Limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"parked": out})
	return nil
}

// KeyJSON is where one key stands: parked or held at the relay, its relay
// dead letters, and, in each consumer group, its rows not yet finished in
// key order: those that hold it (processing, failed, dead; its head is one
// of them) and a page of the pending ones behind.
type KeyJSON struct {
	Key         string           `json:"key"`
	Parked      []ParkedJSON     `json:"parked"`
	DeadLetters []DeadLetterJSON `json:"dead_letters"`
	Groups      []KeyGroupJSON   `json:"groups"`
}

// KeyGroupJSON is a key's unfinished rows in one group; More says the page
// did not hold them all.
type KeyGroupJSON struct {
	Group  string         `json:"group"`
	Events []InboxRowJSON `json:"events"`
	More   bool           `json:"more,omitempty"`
}

// blockingStates are those of a key's rows that its later rows wait for.
var blockingStates = []ferrydriver.InboxState{ferrydriver.InboxProcessing, ferrydriver.InboxFailed, ferrydriver.InboxDead}

func (h *Handler) key(w http.ResponseWriter, r *http.Request) error {
	key := r.PathValue("key")
	f, err := filterFromQuery(r.URL.Query())
	if err != nil {
		return err
	}
	out := KeyJSON{Key: key, DeadLetters: []DeadLetterJSON{}, Groups: []KeyGroupJSON{}}
	if out.Parked, err = h.parkedKeys(r.Context(), []string{key}, 0); err != nil {
		return err
	}
	dls, err := h.cfg.Store.ListDeadLetters(r.Context(), &ferrydriver.ListDeadLettersParams{Key: key, Limit: f.Limit})
	if err != nil {
		return err
	}
	for _, dl := range dls {
		out.DeadLetters = append(out.DeadLetters, deadLetterJSON(dl))
	}
	if h.cfg.Inbox != nil {
		groups, err := h.groupPolicies(r.Context())
		if err != nil {
			return err
		}
		for _, gp := range groups {
			g := gp.Group
			// What holds the key (a row running, retrying or dead: its head
			// is one of them), then a page of what waits, newest first.
			blocking, err := h.cfg.Inbox.ListInbox(r.Context(), &ferrydriver.ListInboxParams{Group: g, States: blockingStates, Key: key, Limit: f.Limit})
			if err != nil {
				return err
			}
			waiting, err := h.cfg.Inbox.ListInbox(r.Context(), &ferrydriver.ListInboxParams{Group: g, States: []ferrydriver.InboxState{ferrydriver.InboxPending}, Key: key, Limit: f.Limit + 1})
			if err != nil {
				return err
			}
			if len(blocking)+len(waiting) == 0 {
				continue
			}
			kg := KeyGroupJSON{Group: g, More: len(blocking) == f.Limit || len(waiting) > f.Limit}
			rows := append(blocking, waiting[:min(len(waiting), f.Limit)]...)
			// A key's rows run in their order: the head first.
			sort.SliceStable(rows, func(i, j int) bool { return rows[i].Event.Seq < rows[j].Event.Seq })
			for _, row := range rows {
				kg.Events = append(kg.Events, inboxRowJSON(row))
			}
			out.Groups = append(out.Groups, kg)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// ChainJSON is a chain source's saved position: the tier it follows, the
// last block it ingested, its reorgs, when it saved, who leads it and, when
// the console can ask the node, the chain's head and the lag in blocks.
type ChainJSON struct {
	Name      string    `json:"name"`
	ChainID   uint64    `json:"chain_id"`
	Tier      string    `json:"tier"`
	Block     uint64    `json:"block"`
	Hash      string    `json:"hash"`
	Window    int       `json:"window_blocks"`
	Reorgs    uint64    `json:"reorgs"`
	SavedAt   time.Time `json:"saved_at"`
	Holder    string    `json:"lease_holder,omitempty"`
	Held      bool      `json:"lease_held"`
	Head      *uint64   `json:"head,omitempty"`
	LagBlocks *uint64   `json:"head_lag_blocks,omitempty"`
	HeadError string    `json:"head_error,omitempty"`
}

func (h *Handler) chains(w http.ResponseWriter, r *http.Request) error {
	out := []ChainJSON{}
	if h.cfg.Chains != nil {
		got, err := h.cfg.Chains(r.Context())
		if err != nil {
			return err
		}
		out = append(out, got...)
	}
	writeJSON(w, http.StatusOK, map[string]any{"chains": out})
	return nil
}

// ReasonJSON is one reason among the newest failures: how many of those
// read have it, the latest, and the newest event IDs (at most MaxPage),
// which an action can take (IDs, a page at a time).
type ReasonJSON struct {
	Reason string    `json:"reason"`
	Count  int       `json:"count"`
	Latest time.Time `json:"latest"`
	IDs    []string  `json:"ids"`
}

// ReasonsJSON groups the newest failures by reason: Scanned of them were
// read, at most Scan (the rest, older, were not).
type ReasonsJSON struct {
	Reasons []ReasonJSON `json:"reasons"`
	Scanned int          `json:"scanned"`
	Scan    int          `json:"scan"`
}

// maxReasonScan bounds ?scan= of a grouping by reason.
const maxReasonScan = 100_000

func (h *Handler) reasons(w http.ResponseWriter, r *http.Request, group func(ferrydriver.ReasonGrouper, context.Context, *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error), backend any, p *ferrydriver.ReasonsParams) error {
	rg, ok := backend.(ferrydriver.ReasonGrouper)
	if !ok {
		return &apiError{http.StatusNotImplemented, "this backend cannot group failures by reason: list them (dead-letters, groups/{group}/events) and group a page"}
	}
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
	out := ReasonsJSON{Reasons: make([]ReasonJSON, len(res.Groups)), Scanned: res.Scanned, Scan: p.Scan}
	for i, g := range res.Groups {
		out.Reasons[i] = ReasonJSON{Reason: g.Reason, Count: g.Count, Latest: g.Latest, IDs: idStrings(g.EventIDs)}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) deadLetterReasons(w http.ResponseWriter, r *http.Request) error {
	return h.reasons(w, r, ferrydriver.ReasonGrouper.DeadLetterReasons, h.cfg.Store, &ferrydriver.ReasonsParams{Feed: r.URL.Query().Get("feed")})
}

func (h *Handler) groupReasons(w http.ResponseWriter, r *http.Request) error {
	in, err := h.inbox()
	if err != nil {
		return err
	}
	return h.reasons(w, r, ferrydriver.ReasonGrouper.InboxDeadReasons, in, &ferrydriver.ReasonsParams{Group: r.PathValue("group")})
}
