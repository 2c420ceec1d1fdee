package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
)

type statusJSON struct {
	Feed            string     `json:"feed"`
	LagEvents       int64      `json:"lag_events"`
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
	DatabaseNow     time.Time  `json:"database_now"`
	PartitionsTotal int        `json:"partitions"`
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("status", stderr)
	var db dbFlags
	db.register(f)
	var feed string
	var asJSON bool
	f.String(&feed, "feed", "FERRY_FEED", "default", "feed name")
	f.Bool(&asJSON, "json", "FERRY_STATUS_JSON", false, "print JSON")
	if err := f.Parse(args); err != nil {
		return err
	}
	pool, drv, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var out []statusJSON
	for p := range db.partitions {
		name := feed + "/" + strconv.Itoa(p)
		st, err := drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: name, Partition: p})
		if err != nil {
			return err
		}
		s := statusJSON{Feed: name, LagEvents: st.LagEvents, DeadLetters: st.DeadLetters, DatabaseNow: st.Now, PartitionsTotal: db.partitions, CheckpointTerm: st.Checkpoint.Term}
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
		out = append(out, s)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if len(out) == 1 {
			return enc.Encode(out[0])
		}
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FEED\tLAG EVENTS\tLAG\tCHECKPOINT\tLEASE\tDEAD LETTERS")
	for _, s := range out {
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
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\n", s.Feed, s.LagEvents, dur(s.LagSeconds), cp, lease, s.DeadLetters)
	}
	return tw.Flush()
}

func dur(sec float64) string {
	return time.Duration(sec * float64(time.Second)).Round(time.Millisecond).String()
}

func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "show") {
		return usagef("say what to do: ferry dlq list [filters] | ferry dlq show <event-id>")
	}
	action := args[0]
	f := newFlags("dlq "+action, stderr)
	var db dbFlags
	db.register(f)
	var feed, key, typ, topic, since, until string
	var limit int
	var asJSON bool
	f.String(&feed, "feed", "FERRY_FEED", "", "only this feed, e.g. default/0 (default: all)")
	f.Bool(&asJSON, "json", "FERRY_DLQ_JSON", false, "print JSON")
	if action == "list" {
		f.String(&key, "key", "FERRY_DLQ_KEY", "", "only this key")
		f.String(&typ, "type", "FERRY_DLQ_TYPE", "", "only this event type")
		f.String(&topic, "topic", "FERRY_DLQ_TOPIC", "", "only this topic")
		f.String(&since, "since", "FERRY_DLQ_SINCE", "", "failed at or after: RFC 3339 time or a duration ago, e.g. 1h")
		f.String(&until, "until", "FERRY_DLQ_UNTIL", "", "failed before: RFC 3339 time or a duration ago")
		f.Int(&limit, "limit", "FERRY_DLQ_LIMIT", 100, "most records to list")
	}
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	if action == "show" && f.fs.NArg() != 1 {
		return usagef("give one event ID: ferry dlq show <event-id>")
	}
	pool, drv, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if action == "show" {
		id, err := uuid.Parse(f.fs.Arg(0))
		if err != nil {
			return usagef("%q is not an event ID (a UUID such as 01927f6e-...)", f.fs.Arg(0))
		}
		dl, err := drv.GetDeadLetter(ctx, &ferrydriver.GetDeadLetterParams{Feed: feed, EventID: id})
		if errors.Is(err, ferrydriver.ErrNotFound) {
			return fmt.Errorf("no relay dead letter with event ID %s (list them with `ferry dlq list`)", id)
		}
		if err != nil {
			return err
		}
		return printDeadLetters(stdout, []*ferrydriver.DeadLetter{dl}, asJSON, true)
	}
	p := &ferrydriver.ListDeadLettersParams{Feed: feed, Key: key, Type: typ, Topic: topic, Limit: limit}
	if p.Since, err = parseWhen(since, "--since"); err != nil {
		return err
	}
	if p.Until, err = parseWhen(until, "--until"); err != nil {
		return err
	}
	dls, err := drv.ListDeadLetters(ctx, p)
	if err != nil {
		return err
	}
	return printDeadLetters(stdout, dls, asJSON, false)
}

func parseWhen(s, flagName string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, usagef("%s %q: use an RFC 3339 time (2026-11-29T10:00:00Z) or a duration ago (90m)", flagName, s)
	}
	return t, nil
}

type deadLetterJSON struct {
	Feed        string            `json:"feed"`
	EventID     string            `json:"event_id"`
	Topic       string            `json:"topic"`
	Key         string            `json:"key"`
	Seq         int64             `json:"seq"`
	Type        string            `json:"type"`
	Source      string            `json:"source,omitempty"`
	ContentType string            `json:"content_type,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	Payload     string            `json:"payload,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	FailedAt    time.Time         `json:"failed_at"`
	Reason      string            `json:"reason"`
}

func printDeadLetters(w io.Writer, dls []*ferrydriver.DeadLetter, asJSON, full bool) error {
	if asJSON {
		out := make([]deadLetterJSON, len(dls))
		for i, d := range dls {
			e := d.Event
			out[i] = deadLetterJSON{Feed: d.Feed, EventID: e.ID.String(), Topic: e.Topic, Key: e.Key, Seq: e.Seq, Type: e.Type, Source: e.Source,
				ContentType: e.ContentType, Headers: e.Headers, Payload: string(e.Payload), CreatedAt: e.CreatedAt, FailedAt: d.FailedAt, Reason: d.Reason}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if full && len(out) == 1 {
			return enc.Encode(out[0])
		}
		return enc.Encode(out)
	}
	if full {
		for _, d := range dls {
			e := d.Event
			fmt.Fprintf(w, "event     %s\nfeed      %s\ntopic     %s\nkey       %s (seq %d)\ntype      %s\nsource    %s\ncreated   %s\nfailed    %s\nreason    %s\n",
				e.ID, d.Feed, e.Topic, e.Key, e.Seq, e.Type, e.Source, e.CreatedAt.Format(time.RFC3339Nano), d.FailedAt.Format(time.RFC3339Nano), d.Reason)
			for k, v := range e.Headers {
				fmt.Fprintf(w, "header    %s: %s\n", k, v)
			}
			fmt.Fprintf(w, "payload   %d bytes, %s\n%s\n", len(e.Payload), e.ContentType, preview(e.Payload, 4096))
		}
		return nil
	}
	if len(dls) == 0 {
		fmt.Fprintln(w, "no relay dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAILED AT\tEVENT ID\tTOPIC\tKEY\tTYPE\tREASON")
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", d.FailedAt.Format(time.RFC3339), d.Event.ID, d.Event.Topic, d.Event.Key, d.Event.Type, preview([]byte(d.Reason), 80))
	}
	return tw.Flush()
}

func preview(b []byte, n int) string {
	s := strings.ToValidUTF8(string(b), "?")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
