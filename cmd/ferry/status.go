package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

type statusJSON struct {
	Feed            string     `json:"feed"`
	LagEvents       int64      `json:"lag_events"`
	LagEstimated    bool       `json:"lag_estimated"`
	LagSeconds      float64    `json:"lag_seconds"`
	OldestPending   *time.Time `json:"oldest_pending,omitempty"`
	CheckpointAt    *time.Time `json:"checkpoint_at,omitempty"`
	CheckpointAge   float64    `json:"checkpoint_age_seconds,omitempty"`
	CheckpointTerm  int64      `json:"checkpoint_term"`
	LeaseHolder     string     `json:"lease_holder,omitempty"`
	LeaseTerm       int64      `json:"lease_term,omitempty"`
	LeaseHeld       bool       `json:"lease_held"`
	LeaseExpiresIn  float64    `json:"lease_expires_in_seconds,omitempty"`
	DeadLetters     int64      `json:"dead_letters"`
	DeadLettersMore bool       `json:"dead_letters_more,omitempty"`
	DatabaseNow     time.Time  `json:"database_now"`
	PartitionsTotal int        `json:"partitions"`
	// Parked lists the keys whose events the relay set aside because their
	// destination did not acknowledge them (oldest first, at most 20).
	Parked     []parkedJSON `json:"parked,omitempty"`
	ParkedKeys int          `json:"parked_keys"`
	HeldKeys   int          `json:"held_keys"`
}

type parkedJSON struct {
	Feed     string    `json:"feed,omitempty"`
	Key      string    `json:"key"`
	Events   int64     `json:"events"`
	Head     string    `json:"head_event_id"`
	ParkedAt time.Time `json:"parked_at"`
	Held     bool      `json:"held"`
	Redriven bool      `json:"redriven,omitempty"`
	Reason   string    `json:"reason"`
}

// groupJSON is a consumer group in `ferry status`: its rows by state,
// each counted to ferrydriver.InboxCountCap, and its dead policy.
type groupJSON struct {
	Group      string           `json:"group"`
	Counts     map[string]int64 `json:"counts"`
	DeadPolicy string           `json:"dead_policy"`
}

// statusReport is what `ferry status --json` prints.
type statusReport struct {
	Feeds  []statusJSON `json:"feeds"`
	Groups []groupJSON  `json:"groups"`
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("status", stderr)
	var db dbFlags
	db.register(f)
	var feed string
	var asJSON, exact bool
	f.String(&feed, "feed", "FERRY_FEED", "", "only this feed: a feed's name (hooks: every partition of it) or a partition's (hooks/0); default: every feed with a checkpoint, a lease or dead letters")
	f.Bool(&asJSON, "json", "FERRY_STATUS_JSON", false, "print JSON: {\"feeds\": [...], \"groups\": [...]}")
	f.Bool(&exact, "exact", "FERRY_STATUS_EXACT", false, fmt.Sprintf("count every pending event and dead letter (reads all of them); without it the lag beyond %d events is estimated and dead letters are counted to %d", ferrydriver.ExactCountLimit, ferrydriver.ExactCountLimit))
	if err := f.Parse(args); err != nil {
		return err
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	drv := b.store
	n, err := partitionCount(ctx, b, db.partitions)
	if err != nil {
		return err
	}
	names, err := driverkit.RelayFeeds(ctx, drv, feed)
	if err != nil {
		return err
	}
	report := statusReport{Feeds: []statusJSON{}, Groups: []groupJSON{}}
	for _, name := range names {
		p, _ := driverkit.FeedPartition(name)
		s, err := feedStatus(ctx, drv, name, p, exact)
		if err != nil {
			return err
		}
		s.PartitionsTotal = n
		report.Feeds = append(report.Feeds, *s)
	}
	if feed == "" {
		if report.Groups, err = groupStatus(ctx, b.inbox); err != nil {
			return err
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	}
	return printStatus(stdout, &report)
}

// feedStatus is one feed partition's status.
func feedStatus(ctx context.Context, drv ferrydriver.Store, name string, partition int, exact bool) (*statusJSON, error) {
	st, err := drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: name, Partition: partition, Exact: exact})
	if err != nil {
		return nil, err
	}
	s := &statusJSON{Feed: name, LagEvents: st.LagEvents, LagEstimated: st.LagEstimated, DeadLetters: st.DeadLetters, DeadLettersMore: st.DeadLettersMore,
		DatabaseNow: st.Now, CheckpointTerm: st.Checkpoint.Term}
	if !st.OldestPending.IsZero() {
		s.OldestPending = &st.OldestPending
		s.LagSeconds = st.Now.Sub(st.OldestPending).Seconds()
	}
	if st.Checkpoint.Cursor != nil {
		s.CheckpointAt = &st.Checkpoint.UpdatedAt
		s.CheckpointAge = st.Now.Sub(st.Checkpoint.UpdatedAt).Seconds()
	}
	if st.Lease != nil {
		s.LeaseHolder, s.LeaseTerm = st.Lease.Holder, st.Lease.Term
		s.LeaseHeld = st.Lease.ExpiresAt.After(st.Lease.Now)
		if s.LeaseHeld {
			s.LeaseExpiresIn = st.Lease.ExpiresAt.Sub(st.Lease.Now).Seconds()
		}
	}
	heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: name, Limit: maxParkedShown})
	if err != nil {
		return nil, err
	}
	s.ParkedKeys = len(heads)
	for i, h := range heads {
		if h.Held {
			s.HeldKeys++
		}
		if i < 20 {
			s.Parked = append(s.Parked, parkedJSON{Key: h.Event.Key, Events: h.Queued, Head: h.Event.ID.String(), ParkedAt: h.ParkedAt, Held: h.Held, Reason: h.Reason})
		}
	}
	return s, nil
}

// groupStatus lists the consumer groups the inbox knows of, with their
// rows by state (each counted to ferrydriver.InboxCountCap).
func groupStatus(ctx context.Context, in inboxAdmin) ([]groupJSON, error) {
	gl, ok := in.(ferrydriver.Admin)
	if !ok {
		return []groupJSON{}, nil
	}
	groups, err := gl.InboxGroups(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]groupJSON, 0, len(groups))
	for _, g := range groups {
		counts, err := in.InboxCounts(ctx, g.Group)
		if err != nil {
			return nil, err
		}
		c := map[string]int64{}
		for st, n := range counts {
			c[string(st)] = n
		}
		policy := "continue"
		if g.HoldDead {
			policy = "hold"
		}
		out = append(out, groupJSON{Group: g.Group, Counts: c, DeadPolicy: policy})
	}
	return out, nil
}

func printStatus(stdout io.Writer, report *statusReport) error {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FEED\tLAG EVENTS\tLAG\tCHECKPOINT\tLEASE\tDEAD LETTERS")
	estimated := false
	for _, s := range report.Feeds {
		cp := "never saved"
		if s.CheckpointAt != nil {
			cp = fmt.Sprintf("%s ago (term %d)", dur(s.CheckpointAge), s.CheckpointTerm)
		}
		lease := "no relay has run"
		if s.LeaseHolder != "" {
			if s.LeaseHeld {
				lease = fmt.Sprintf("%s, term %d, expires in %s", s.LeaseHolder, s.LeaseTerm, dur(s.LeaseExpiresIn))
			} else {
				lease = fmt.Sprintf("free (last %s, term %d)", s.LeaseHolder, s.LeaseTerm)
			}
		}
		lag, dead := strconv.FormatInt(s.LagEvents, 10), strconv.FormatInt(s.DeadLetters, 10)
		if s.LagEstimated {
			lag, estimated = "~"+lag, true
		}
		if s.DeadLettersMore {
			dead, estimated = ">"+dead, true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Feed, lag, dur(s.LagSeconds), cp, lease, dead)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if estimated {
		fmt.Fprintf(stdout, "~ estimated from the first %d pending events, > counted to %d (LAG is the oldest of those): --exact counts them all\n",
			ferrydriver.ExactCountLimit, ferrydriver.ExactCountLimit)
	}
	for _, s := range report.Feeds {
		if s.ParkedKeys == 0 {
			continue
		}
		fmt.Fprintf(stdout, "\n%s: %d key(s) parked (their destination did not acknowledge them, or a dead letter was redriven), %d held; see `ferry parked list --feed %s`\n",
			s.Feed, s.ParkedKeys, s.HeldKeys, s.Feed)
		for _, p := range s.Parked {
			state := "retrying"
			if p.Held {
				state = "held"
			}
			fmt.Fprintf(stdout, "  %s: %d event(s), %s since %s: %s\n", p.Key, p.Events, state, dur(s.DatabaseNow.Sub(p.ParkedAt).Seconds())+" ago", p.Reason)
		}
	}
	if len(report.Groups) == 0 {
		return nil
	}
	fmt.Fprintln(stdout)
	tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tPENDING\tPROCESSING\tRETRYING\tDEAD\tDEAD POLICY")
	count := func(c map[string]int64, st ferrydriver.InboxState) string {
		n := c[string(st)]
		if n >= ferrydriver.InboxCountCap {
			return strconv.FormatInt(n, 10) + "+"
		}
		return strconv.FormatInt(n, 10)
	}
	for _, g := range report.Groups {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", g.Group, count(g.Counts, ferrydriver.InboxPending), count(g.Counts, ferrydriver.InboxProcessing),
			count(g.Counts, ferrydriver.InboxFailed), count(g.Counts, ferrydriver.InboxDead), g.DeadPolicy)
	}
	return tw.Flush()
}

func dur(sec float64) string {
	return time.Duration(sec * float64(time.Second)).Round(time.Millisecond).String()
}
