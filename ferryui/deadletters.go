package ferryui

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
)

func deadLetterJSON(dl *ferrydriver.DeadLetter) uiapi.DeadLetterJSON {
	return uiapi.DeadLetterJSON{Feed: dl.Feed, Reason: dl.Reason, FailedAt: dl.FailedAt, Event: eventJSON(&dl.Event)}
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
	items := make([]uiapi.DeadLetterJSON, len(got.items))
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

// deadLetter answers an event's dead letters (of ?feed= only, when given:
// a feed's name or a partition's).
func (h *Handler) deadLetter(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	feed := r.URL.Query().Get("feed")
	dls, err := h.cfg.Store.ListDeadLetters(r.Context(), &ferrydriver.ListDeadLettersParams{Feed: feed, EventIDs: []uuid.UUID{id}, Limit: MaxPage})
	if err != nil {
		return err
	}
	if len(dls) == 0 {
		where := ""
		if feed != "" {
			where = " in feed " + feed
		}
		return &apiError{http.StatusNotFound, "no relay dead letter has event ID " + id.String() + where}
	}
	out := uiapi.DeadLettersOfJSON{ID: id.String(), DeadLetters: make([]uiapi.DeadLetterJSON, len(dls))}
	for i, dl := range dls {
		out.DeadLetters[i] = deadLetterJSON(dl)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deadLettersAction redrives or discards relay dead letters: those the
// request names, each by feed and event, or those its filter selects in
// the database, every filter applied there (its page holds the first
// matches however far back they are: an action is an operator's write, a
// page at a time, not a page the console polls). Either way the action
// acts on the dead letters selected, each by its feed and event, and on
// no other feed's.
func (h *Handler) deadLettersAction(redrive bool) func(w http.ResponseWriter, r *http.Request) error {
	verb, act := "discarded", h.cfg.Store.DiscardDeadLetters
	if redrive {
		verb, act = "redriven", h.cfg.Store.RedriveDeadLetters
	}
	choose := func(ctx context.Context, named selection, f *uiapi.Filter) (selection, bool, error) {
		if f == nil {
			// What is still there of what was named, feed by feed.
			byFeed := map[string][]uuid.UUID{}
			for _, n := range named {
				byFeed[n.Feed] = append(byFeed[n.Feed], n.EventID)
			}
			var out selection
			for feed, ids := range byFeed {
				dls, err := h.cfg.Store.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: feed, EventIDs: ids, Limit: len(ids)})
				if err != nil {
					return nil, false, err
				}
				for _, dl := range dls {
					if dl.Feed == feed { // a partition named, not a feed's name
						out = append(out, ferrydriver.DeadLetterRef{Feed: feed, EventID: dl.Event.ID})
					}
				}
			}
			return out, false, nil
		}
		dls, err := h.cfg.Store.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: f.Feed, Key: f.Key, Type: f.Type, Topic: f.Topic,
			Reason: f.Reason, Since: f.Since, Until: f.Until, Limit: f.Limit})
		if err != nil {
			return nil, false, err
		}
		return driverkit.Refs(dls), len(dls) == f.Limit, nil
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		return h.act(w, r, "relay dead letters "+verb, true, choose, func(ctx context.Context, selected selection) (int, error) {
			return act(ctx, selected)
		})
	}
}

func (h *Handler) deadLetterReasons(w http.ResponseWriter, r *http.Request) error {
	return h.reasons(w, r, ferrydriver.Admin.DeadLetterReasons, h.cfg.Store, &ferrydriver.ReasonsParams{Feed: r.URL.Query().Get("feed")})
}
