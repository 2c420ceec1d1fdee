package ferryui

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
)

func inboxRowJSON(r *ferrydriver.InboxRow) uiapi.InboxRowJSON {
	out := uiapi.InboxRowJSON{Group: r.Group, State: string(r.State), Attempts: r.Attempts, LastError: r.LastError, ReceivedAt: r.ReceivedAt, Event: eventJSON(&r.Event)}
	if !r.FinishedAt.IsZero() {
		out.FinishedAt = &r.FinishedAt
	}
	if r.State == ferrydriver.InboxFailed {
		out.NextAttemptAt = &r.NextAttemptAt
	}
	return out
}

// groupPolicies lists the groups, each with its stored policy (true:
// hold) when the inbox lists them, in name order.
func (h *Handler) groupPolicies(ctx context.Context) ([]ferrydriver.GroupPolicy, error) {
	hold := map[string]bool{}
	for _, g := range h.cfg.Groups {
		hold[g] = true
	}
	if h.cfg.Inbox != nil {
		listed, err := h.cfg.Inbox.InboxGroups(ctx)
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
	out := make([]uiapi.GroupJSON, 0, len(groups))
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
		out = append(out, uiapi.GroupJSON{Group: g, Counts: c, DeadPolicy: policyName(gp.HoldDead)})
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
	if driverkit.CheckInboxCursor(list) != nil {
		return badRequest("after= pages lists of finished events only (state=dead, processed, discarded, retracted): ask for one of those")
	}
	got, err := pageInbox(r.Context(), in, *list, scan)
	if err != nil {
		return err
	}
	items := make([]uiapi.InboxRowJSON, len(got.items))
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
		choose := func(ctx context.Context, named selection, f *uiapi.Filter) (selection, bool, error) {
			ids := make([]uuid.UUID, len(named))
			for i, n := range named {
				ids[i] = n.EventID
			}
			list := &ferrydriver.ListInboxParams{Group: group, States: dead, EventIDs: ids, Limit: MaxPage}
			if f != nil {
				if f.Topic != "" || f.Reason != "" || f.Feed != "" {
					return nil, false, badRequest("a group's dead events are selected by key, type, since and until: feed, topic and reason select relay dead letters")
				}
				list = &ferrydriver.ListInboxParams{Group: group, States: dead, Key: f.Key, Type: f.Type, Since: f.Since, Until: f.Until, Limit: f.Limit}
			}
			rows, err := in.ListInbox(ctx, list)
			if err != nil {
				return nil, false, err
			}
			out := make(selection, len(rows))
			for i, row := range rows {
				out[i] = ferrydriver.DeadLetterRef{EventID: row.Event.ID}
			}
			return out, f != nil && len(rows) == f.Limit, nil
		}
		return h.act(w, r, "group "+group+": dead events "+verb, false, choose, func(ctx context.Context, selected selection) (int, error) {
			ids := make([]uuid.UUID, len(selected))
			for i, s := range selected {
				ids[i] = s.EventID
			}
			return act(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: ids})
		})
	}
}

func (h *Handler) groupPolicy(w http.ResponseWriter, r *http.Request) error {
	in, err := h.inbox()
	if err != nil {
		return err
	}
	var req uiapi.PolicyRequest
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

func (h *Handler) groupReasons(w http.ResponseWriter, r *http.Request) error {
	in, err := h.inbox()
	if err != nil {
		return err
	}
	return h.reasons(w, r, ferrydriver.Admin.InboxDeadReasons, in, &ferrydriver.ReasonsParams{Group: r.PathValue("group")})
}
