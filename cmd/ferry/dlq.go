package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
)

func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, err := pickSubcommand("dlq", args, []subcommand{
		{"list", "the relay's dead letters (--group G: a consumer group's), filtered by --feed --key --type --topic --since --until"},
		{"show", "show <event-id>: one dead letter, whole"},
		{"redrive", "publish (or, --group, run) what list shows again, same event IDs (--dry-run previews)"},
		{"discard", "drop what list shows (--dry-run previews)"},
	}, stdout)
	if err != nil {
		return err
	}
	f := newFlags("dlq "+action, stderr)
	f.AcceptArgs()
	var db dbFlags
	db.register(f)
	var feed, group, key, typ, topic, since, until string
	var limit int
	var asJSON, dryRun bool
	f.String(&feed, "feed", "FERRY_FEED", "", "relay dead letters of this feed only, e.g. default/0 (default: all)")
	f.String(&group, "group", "FERRY_GROUP", "", "a consumer group: its dead letters instead of the relay's")
	f.Bool(&asJSON, "json", "FERRY_DLQ_JSON", false, "print JSON")
	f.String(&key, "key", "FERRY_DLQ_KEY", "", "only this key")
	f.String(&typ, "type", "FERRY_DLQ_TYPE", "", "only this event type")
	f.String(&topic, "topic", "FERRY_DLQ_TOPIC", "", "only this topic (relay dead letters)")
	f.String(&since, "since", "FERRY_DLQ_SINCE", "", "failed at or after: RFC 3339 time or a duration ago, e.g. 1h")
	f.String(&until, "until", "FERRY_DLQ_UNTIL", "", "failed before: RFC 3339 time or a duration ago")
	f.Int(&limit, "limit", "FERRY_DLQ_LIMIT", 100, "most records to list (or to redrive/discard by filter)")
	f.Bool(&dryRun, "dry-run", "FERRY_DLQ_DRY_RUN", false, "redrive, discard: list what would be acted on and change nothing")
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	var ids []uuid.UUID
	for _, a := range f.Args() {
		id, err := uuid.Parse(a)
		if err != nil {
			return usagef("%q is not an event ID (a UUID such as 01927f6e-...)", a)
		}
		ids = append(ids, id)
	}
	if action == "show" && len(ids) != 1 {
		return usagef("give one event ID: ferry dlq show <event-id>")
	}
	sinceT, err := parseWhen(since, "--since")
	if err != nil {
		return err
	}
	untilT, err := parseWhen(until, "--until")
	if err != nil {
		return err
	}
	if group != "" && topic != "" {
		return usagef("--topic selects relay dead letters; a consumer group's are selected by --key, --type, --since, --until or event IDs")
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	drv := b.inbox
	if group == "" {
		return relayDLQ(ctx, stdout, b.store, action, ids, &ferrydriver.ListDeadLettersParams{Feed: feed, Key: key, Type: typ, Topic: topic, Since: sinceT, Until: untilT, EventIDs: ids, Limit: limit}, asJSON, dryRun)
	}
	p := &ferrydriver.ListInboxParams{Group: group, Key: key, Type: typ, EventIDs: ids, Since: sinceT, Until: untilT, Limit: limit}
	if action == "show" {
		p.States = ferrydriver.InboxStates
	}
	rows, err := drv.ListInbox(ctx, p)
	if err != nil {
		return err
	}
	switch action {
	case "list", "show":
		if action == "show" && len(rows) == 0 {
			return fmt.Errorf("group %s has no event %s", group, ids[0])
		}
		return printInboxRows(stdout, rows, asJSON, action == "show")
	}
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "no dead letters of group %s match\n", group)
		return nil
	}
	if dryRun {
		if err := printInboxRows(stdout, rows, asJSON, false); err != nil {
			return err
		}
		if !asJSON {
			fmt.Fprintf(stdout, "%d dead letter(s) of group %s would be %s; nothing changed (--dry-run)\n", len(rows), group, pastTense(action))
		}
		return nil
	}
	sel := &ferrydriver.InboxIDsParams{Group: group}
	for _, r := range rows {
		sel.EventIDs = append(sel.EventIDs, r.Event.ID)
	}
	var n int
	if action == "redrive" {
		n, err = drv.RedriveInbox(ctx, sel)
	} else {
		n, err = drv.DiscardInbox(ctx, sel)
	}
	if err != nil {
		return err
	}
	verb := map[string]string{"redrive": "redriven: they run again, first in their keys' order", "discard": "discarded: their keys are released"}[action]
	fmt.Fprintf(stdout, "%d dead letter(s) of group %s %s\n", n, group, verb)
	return nil
}

func pastTense(action string) string {
	return map[string]string{"redrive": "redriven", "discard": "discarded"}[action]
}

// relayDLQ lists, shows, redrives or discards relay dead letters. Like a
// group's, redrive and discard act on exactly what list shows with the same
// flags (by event ID, at most --limit), so that `ferry dlq list ...` is
// the preview and --dry-run says it again.
func relayDLQ(ctx context.Context, stdout io.Writer, drv ferrydriver.Store, action string, ids []uuid.UUID, p *ferrydriver.ListDeadLettersParams, asJSON, dryRun bool) error {
	if action == "show" {
		dl, err := drv.GetDeadLetter(ctx, &ferrydriver.GetDeadLetterParams{Feed: p.Feed, EventID: ids[0]})
		if errors.Is(err, ferrydriver.ErrNotFound) {
			return fmt.Errorf("no relay dead letter with event ID %s (list them with `ferry dlq list`; a consumer group's with --group)", ids[0])
		}
		if err != nil {
			return err
		}
		return printDeadLetters(stdout, []*ferrydriver.DeadLetter{dl}, asJSON, true)
	}
	dls, err := drv.ListDeadLetters(ctx, p)
	if err != nil {
		return err
	}
	if action == "list" {
		return printDeadLetters(stdout, dls, asJSON, false)
	}
	if len(dls) == 0 {
		fmt.Fprintln(stdout, "no relay dead letters match")
		return nil
	}
	if dryRun {
		if err := printDeadLetters(stdout, dls, asJSON, false); err != nil {
			return err
		}
		if !asJSON {
			fmt.Fprintf(stdout, "%d relay dead letter(s) would be %s; nothing changed (--dry-run)\n", len(dls), pastTense(action))
		}
		return nil
	}
	sel := &ferrydriver.DeadLetterSelection{Letters: ferrydriver.Refs(dls)}
	var n int
	if action == "redrive" {
		n, err = drv.RedriveDeadLetters(ctx, sel)
	} else {
		n, err = drv.DiscardDeadLetters(ctx, sel)
	}
	if err != nil {
		return err
	}
	verb := map[string]string{
		"redrive": "redriven: each goes back, with its event ID, to the feed that dead-lettered it (and no other), after what that feed published of its key",
		"discard": "discarded",
	}[action]
	fmt.Fprintf(stdout, "%d relay dead letter(s) %s\n", n, verb)
	return nil
}

func printInboxRows(w io.Writer, rows []*ferrydriver.InboxRow, asJSON, full bool) error {
	if asJSON {
		type rowJSON struct {
			Group      string    `json:"group"`
			EventID    string    `json:"event_id"`
			Key        string    `json:"key"`
			Seq        int64     `json:"seq"`
			Type       string    `json:"type"`
			State      string    `json:"state"`
			Attempts   int       `json:"attempts"`
			LastError  string    `json:"last_error,omitempty"`
			ReceivedAt time.Time `json:"received_at"`
			FinishedAt time.Time `json:"finished_at,omitempty"`
			Payload    string    `json:"payload,omitempty"`
		}
		out := make([]rowJSON, len(rows))
		for i, r := range rows {
			out[i] = rowJSON{r.Group, r.Event.ID.String(), r.Event.Key, r.Event.Seq, r.Event.Type, string(r.State), r.Attempts, r.LastError, r.ReceivedAt, r.FinishedAt, string(r.Event.Payload)}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if full {
		for _, r := range rows {
			e := r.Event
			fmt.Fprintf(w, "event     %s\ngroup     %s\nkey       %s (seq %d)\ntype      %s\nstate     %s after %d attempt(s)\nreceived  %s\nerror     %s\npayload   %d bytes\n%s\n",
				e.ID, r.Group, e.Key, e.Seq, e.Type, r.State, r.Attempts, r.ReceivedAt.Format(time.RFC3339Nano), r.LastError, len(e.Payload), preview(e.Payload, 4096))
		}
		return nil
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAILED AT\tEVENT ID\tKEY\tTYPE\tATTEMPTS\tERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", r.FinishedAt.Format(time.RFC3339), r.Event.ID, r.Event.Key, r.Event.Type, r.Attempts, preview([]byte(firstLine(r.LastError)), 80))
	}
	return tw.Flush()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
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
