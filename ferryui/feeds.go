package ferryui

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// FeedJSON is one partition of a relay feed.
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

// feeds lists every relay feed partition the store knows of (a
// checkpoint, a lease, dead letters, parked events: every partition of
// each such feed), or those of ?feed= (a feed's name or a partition's).
func (h *Handler) feeds(w http.ResponseWriter, r *http.Request) error {
	names, err := driverkit.RelayFeeds(r.Context(), h.cfg.Store, r.URL.Query().Get("feed"))
	if err != nil {
		return err
	}
	out := make([]FeedJSON, 0, len(names))
	for _, name := range names {
		p, _ := driverkit.FeedPartition(name)
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

// ParkedJSON is a key the relay set aside because its destination stopped
// acknowledging it, or whose redriven dead letter waits for the feed's
// relay (redriven): its first parked event, and whether the relay gave up
// retrying it (held: `ferry parked release` or skip lets it go).
type ParkedJSON struct {
	Feed     string    `json:"feed"`
	Key      string    `json:"key"`
	Held     bool      `json:"held"`
	Redriven bool      `json:"redriven,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	ParkedAt time.Time `json:"parked_at"`
	Queued   int64     `json:"queued"`
	Event    EventJSON `json:"event"`
}

func parkedJSON(p *ferrydriver.ParkedEvent) ParkedJSON {
	return ParkedJSON{Feed: p.Feed, Key: p.Event.Key, Held: p.Held, Redriven: p.Redriven, Reason: p.Reason, ParkedAt: p.ParkedAt, Queued: p.Queued, Event: eventJSON(&p.Event)}
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
func (h *Handler) parkedKeys(ctx context.Context, keys []string, limit int) ([]ParkedJSON, error) {
	out := []ParkedJSON{}
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
