package ferryui

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
)

// An event that is neither a dead letter nor in an inbox is looked for in
// the backlog: the outbox has no index on event IDs (one would cost every
// append), so the backlog is read the way the relay reads it, outboxScan
// events in all (?scan= up to maxOutboxScan), shared evenly among the
// partitions: the first 4,000 unpublished events of one partition, the
// first 1,000 of each of four: about 100-150 ms on PostgreSQL with a
// backlog of 1,000,000 events (BenchmarkPagesAtScale), most of it the
// feeds' opening. Each partition's read opens a feed (on MariaDB, a
// replication connection): lookups run maxBacklogLookups at a time, each
// over at most maxOutboxScan events; one more is answered 503.
const (
	outboxScan        = 4_000
	maxOutboxScan     = 20_000
	maxBacklogLookups = 2
)

func (h *Handler) event(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	out := uiapi.EventTimelineJSON{ID: id.String(), DeadLetters: []uiapi.DeadLetterJSON{}, Groups: []uiapi.InboxRowJSON{}}
	dls, err := h.cfg.Store.ListDeadLetters(r.Context(), &ferrydriver.ListDeadLettersParams{EventIDs: []uuid.UUID{id}, Limit: MaxPage})
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
	if len(out.DeadLetters) == 0 && len(out.Groups) == 0 {
		scan := outboxScan
		if v := r.URL.Query().Get("scan"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxOutboxScan {
				return badRequest("scan=%q is not a count of events to read: use 1 to %d (default %d)", v, maxOutboxScan, outboxScan)
			}
			scan = n
		}
		select {
		case h.lookups <- struct{}{}:
			defer func() { <-h.lookups }()
		default:
			w.Header().Set("Retry-After", "1")
			return &apiError{http.StatusServiceUnavailable, fmt.Sprintf("%d lookups of the outbox's backlog are running: ask again in a moment", maxBacklogLookups)}
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
func (h *Handler) unpublished(ctx context.Context, id uuid.UUID, scan int) (*uiapi.OutboxJSON, error) {
	feeds, err := h.partitionFeeds(ctx)
	if err != nil {
		return nil, err
	}
	// The partitions are read side by side, four at a time: opening a feed
	// and its first read cost 20-35 ms on PostgreSQL (a session of its own,
	// a snapshot, the transactions since the checkpoint), the events after
	// that about 5 µs each.
	found := make([]*uiapi.OutboxJSON, len(feeds))
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

func (h *Handler) findInFeed(ctx context.Context, name string, partition int, id uuid.UUID, scan int) (*uiapi.OutboxJSON, error) {
	cp, err := h.cfg.Store.LoadCheckpoint(ctx, name)
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
				return &uiapi.OutboxJSON{Feed: name, Ahead: read + i, Event: eventJSON(ev)}, nil
			}
		}
		for _, inv := range b.Invalid {
			if inv.Event.ID == id {
				return &uiapi.OutboxJSON{Feed: name, Ahead: read + len(b.Events), Invalid: inv.Reason, Event: eventJSON(&inv.Event)}, nil
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
// one (ferrydriver.Admin).
func (h *Handler) history(ctx context.Context, group string, id uuid.UUID) ([]uiapi.AttemptJSON, error) {
	if h.cfg.Inbox == nil {
		return nil, nil
	}
	entries, err := h.cfg.Inbox.InboxAttempts(ctx, &ferrydriver.InboxAttemptsParams{Group: group, EventID: id})
	if err != nil {
		return nil, err
	}
	var out []uiapi.AttemptJSON
	for _, e := range entries {
		out = append(out, uiapi.AttemptJSON{Attempt: e.Attempt, State: string(e.State), Error: e.Error, At: e.At})
	}
	return out, nil
}

// blockingStates are those of a key's rows that its later rows wait for.
var blockingStates = []ferrydriver.InboxState{ferrydriver.InboxProcessing, ferrydriver.InboxFailed, ferrydriver.InboxDead}

func (h *Handler) key(w http.ResponseWriter, r *http.Request) error {
	key := r.PathValue("key")
	f, err := filterFromQuery(r.URL.Query())
	if err != nil {
		return err
	}
	out := uiapi.KeyJSON{Key: key, DeadLetters: []uiapi.DeadLetterJSON{}, Groups: []uiapi.KeyGroupJSON{}}
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
			kg := uiapi.KeyGroupJSON{Group: g, More: len(blocking) == f.Limit || len(waiting) > f.Limit}
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
