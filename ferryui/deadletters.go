package ferryui

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
)

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

func (h *Handler) deadLetterReasons(w http.ResponseWriter, r *http.Request) error {
	return h.reasons(w, r, ferrydriver.ReasonGrouper.DeadLetterReasons, h.cfg.Store, &ferrydriver.ReasonsParams{Feed: r.URL.Query().Get("feed")})
}
