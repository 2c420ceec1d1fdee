package ferryui

import (
	"context"
	"net/http"
	"strconv"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// feeds lists every relay feed partition the store knows of (a
// checkpoint, a lease, dead letters, parked events: every partition of
// each such feed), or those of ?feed= (a feed's name or a partition's).
func (h *Handler) feeds(w http.ResponseWriter, r *http.Request) error {
	names, err := driverkit.RelayFeeds(r.Context(), h.cfg.Store, r.URL.Query().Get("feed"))
	if err != nil {
		return err
	}
	out := make([]uiapi.FeedJSON, 0, len(names))
	for _, name := range names {
		p, _ := driverkit.FeedPartition(name)
		st, err := h.cfg.Store.FeedStatus(r.Context(), &ferrydriver.FeedStatusParams{Feed: name, Partition: p})
		if err != nil {
			return err
		}
		f := uiapi.FeedJSON{Feed: name, LagEvents: st.LagEvents, LagEstimated: st.LagEstimated, DeadLetters: st.DeadLetters,
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
			page["oldest_outbox_tx"] = uiapi.OpenTxJSON{PID: tx.PID, Started: tx.Started, AgeSeconds: tx.Now.Sub(tx.Started).Seconds(), State: tx.State, Application: tx.Application}
		}
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

func parkedJSON(p *ferrydriver.ParkedEvent) uiapi.ParkedJSON {
	return uiapi.ParkedJSON{Feed: p.Feed, Key: p.Event.Key, Held: p.Held, Redriven: p.Redriven, Reason: p.Reason, ParkedAt: p.ParkedAt, Queued: p.Queued, Event: eventJSON(&p.Event)}
}

// partitionFeeds names the partitions (Feed/0, Feed/1, ...) of the feed
// whose position an event's lookup in the backlog reads from.
func (h *Handler) partitionFeeds(ctx context.Context) ([]string, error) {
	n, err := h.cfg.Store.StoredPartitions(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, n)
	for p := range n {
		out[p] = h.cfg.Feed + "/" + strconv.Itoa(p)
	}
	return out, nil
}

// parkedKeys returns the parked keys of every feed (all of them, at most
// limit per feed partition, when keys is nil).
func (h *Handler) parkedKeys(ctx context.Context, keys []string, limit int) ([]uiapi.ParkedJSON, error) {
	out := []uiapi.ParkedJSON{}
	feeds, err := driverkit.RelayFeeds(ctx, h.cfg.Store, "")
	if err != nil {
		return nil, err
	}
	for _, feed := range feeds {
		heads, err := h.cfg.Store.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed, Keys: keys, Limit: limit})
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

func (h *Handler) chains(w http.ResponseWriter, r *http.Request) error {
	out := []uiapi.ChainJSON{}
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
