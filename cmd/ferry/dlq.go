package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
	"golang.org/x/term"
)

// dlqSelectors are the flags that select dead letters for redrive and
// discard, given on the command line (a variable in the environment
// narrows a selection but makes none).
var dlqSelectors = []string{"feed", "group", "key", "type", "topic", "reason", "since", "before", "all"}

// dlqRules is what `ferry dlq redrive|discard -h` says after the flags.
const dlqRules = `
Selection: %[1]s acts only on dead letters you select, on the command line: event IDs,
--feed (hooks: every partition of the feed; hooks/0: one), --group, --key, --type,
--topic, --reason (a text the reason contains), --since, --before, or --all for every
one. With none it refuses and changes nothing. It acts on what ferry dlq list shows with
the same flags: the newest --limit (100) that match; run it again for the rest.
Confirmation: it shows how many dead letters it selected (and of how many that match)
and asks on a terminal; --yes answers for scripts, and without a terminal it refuses
unless --yes is given. --dry-run lists the selection and changes nothing.
`

func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, err := pickSubcommand("dlq", args, []subcommand{
		{"list", "the relay's dead letters (--group G: a consumer group's), newest first, and how many match; filtered by --feed --key --type --topic --reason --since --before"},
		{"show", "show <event-id>: an event's dead letters, whole (one per feed that dead-lettered it)"},
		{"redrive", "send what a selection matches back: each to the feed that dead-lettered it (--group: to the group's handler); counts, then asks"},
		{"discard", "drop what a selection matches; counts, then asks"},
	}, stdout)
	if err != nil {
		return err
	}
	f := newFlags("dlq "+action, stderr)
	f.AcceptArgs()
	var db dbFlags
	db.register(f)
	var feed, group, key, typ, topic, reason, since, before string
	var limit int
	var asJSON, dryRun, all, yes bool
	f.String(&feed, "feed", "FERRY_FEED", "", "relay dead letters of this feed only: a feed's name (hooks: every partition of it) or a partition's (hooks/0); default: every feed")
	f.String(&group, "group", "FERRY_GROUP", "", "a consumer group: its dead letters instead of the relay's")
	f.Bool(&asJSON, "json", "FERRY_DLQ_JSON", false, "print JSON")
	f.String(&key, "key", "FERRY_DLQ_KEY", "", "only this key")
	f.String(&typ, "type", "FERRY_DLQ_TYPE", "", "only this event type")
	f.String(&topic, "topic", "FERRY_DLQ_TOPIC", "", "only this topic (relay dead letters)")
	f.String(&reason, "reason", "FERRY_DLQ_REASON", "", "only dead letters whose reason contains this text (relay dead letters)")
	f.String(&since, "since", "FERRY_DLQ_SINCE", "", "failed at or after: RFC 3339 time or a duration ago, e.g. 1h")
	f.String(&before, "before", "FERRY_DLQ_BEFORE", "", "failed before: RFC 3339 time or a duration ago")
	f.Int(&limit, "limit", "FERRY_DLQ_LIMIT", 100, "most dead letters to list, or to redrive or discard at once (the newest that match)")
	if action == "redrive" || action == "discard" {
		f.Bool(&dryRun, "dry-run", "FERRY_DLQ_DRY_RUN", false, "list what would be acted on and change nothing")
		f.CommandLineBool(&all, "all", "select every dead letter (of --group's, with --group): for when no filter applies")
		f.CommandLineBool(&yes, "yes", "do not ask: act on the selection (for scripts; without a terminal to ask on, it is needed)")
		f.fs.Usage = func() {
			fmt.Fprintf(f.fs.Output(), "Usage of %s:\n", f.fs.Name())
			f.fs.PrintDefaults()
			fmt.Fprintf(f.fs.Output(), dlqRules, f.fs.Name())
		}
	}
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
	if action == "redrive" || action == "discard" {
		if err := checkSelection(f, action, len(ids) > 0, all); err != nil {
			return err
		}
	}
	sinceT, err := parseWhen(since, "--since")
	if err != nil {
		return err
	}
	beforeT, err := parseWhen(before, "--before")
	if err != nil {
		return err
	}
	if limit < 1 {
		return usagef("--limit %d: give how many dead letters at most, 1 or more (default 100)", limit)
	}
	if group != "" && (topic != "" || reason != "" || feed != "") {
		return usagef("--feed, --topic and --reason select relay dead letters; a consumer group's are selected by --key, --type, --since, --before or event IDs")
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	act := &dlqAction{action: action, stdout: stdout, asJSON: asJSON, dryRun: dryRun, yes: yes, confirm: terminalConfirm(stdout)}
	if group == "" {
		if err := knownFeed(ctx, b.store, feed); err != nil {
			return err
		}
		return act.relay(ctx, b.store, ids, &ferrydriver.ListDeadLettersParams{Feed: feed, Key: key, Type: typ, Topic: topic, Reason: reason,
			Since: sinceT, Until: beforeT, EventIDs: ids, Limit: limit})
	}
	if err := knownGroup(ctx, b.inbox, group); err != nil {
		return err
	}
	p := &ferrydriver.ListInboxParams{Group: group, Key: key, Type: typ, EventIDs: ids, Since: sinceT, Until: beforeT, Limit: limit}
	if action == "show" {
		p.States = ferrydriver.InboxStates
	}
	filtered := key != "" || typ != "" || len(ids) > 0 || since != "" || before != ""
	return act.group(ctx, b.inbox, p, filtered)
}

// checkSelection refuses a redrive or discard that selects nothing on the
// command line: typed to read its usage, it must change nothing.
func checkSelection(f *envFlags, action string, ids, all bool) error {
	var given []string
	for _, name := range dlqSelectors {
		if name != "all" && f.isSet(name) {
			given = append(given, "--"+name)
		}
	}
	switch {
	case all && (len(given) > 0 || ids):
		return usagef("--all selects every dead letter: leave out --all, or the event IDs and %s", strings.Join(given, " "))
	case !all && len(given) == 0 && !ids:
		return usagef("say which dead letters to %s: event IDs, --feed, --group, --key, --type, --topic, --reason, --since or --before, or --all for every one (`ferry dlq list` shows them; nothing changed)", action)
	}
	return nil
}

// knownFeed refuses a --feed that names no feed the store knows of
// (listing nothing would look like "no dead letters").
func knownFeed(ctx context.Context, s ferrydriver.Store, feed string) error {
	if feed == "" {
		return nil
	}
	names, err := s.ListFeeds(ctx)
	if err != nil {
		return err
	}
	var known []string
	seen := map[string]bool{}
	for _, n := range names {
		if !driverkit.IsFeedName(n) {
			continue
		}
		if driverkit.InFeed(feed, n) {
			return nil
		}
		if f := n[:strings.LastIndexByte(n, '/')]; !seen[f] {
			seen[f] = true
			known = append(known, f)
		}
	}
	return usagef("--feed %s: no feed of that name has a checkpoint, a lease or dead letters (the feeds: %s; a partition is <feed>/<n>, e.g. %s/0)",
		feed, orNone(known), firstOr(known, "default"))
}

// knownGroup refuses a --group the inbox does not know of.
func knownGroup(ctx context.Context, in inboxAdmin, group string) error {
	gl, ok := in.(ferrydriver.Admin)
	if !ok {
		return nil
	}
	groups, err := gl.InboxGroups(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, g := range groups {
		if g.Group == group {
			return nil
		}
		names = append(names, g.Group)
	}
	return usagef("--group %s: the group does not exist: no consumer of it has received an event (the groups: %s)", group, orNone(names))
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "none yet"
	}
	return strings.Join(names, ", ")
}

func firstOr(names []string, def string) string {
	if len(names) == 0 {
		return def
	}
	return names[0]
}

// dlqAction lists, shows, redrives or discards dead letters.
type dlqAction struct {
	action              string
	stdout              io.Writer
	asJSON, dryRun, yes bool
	confirm             func(question string) (bool, error)
}

// terminalConfirm asks on the terminal, when stdin is one.
func terminalConfirm(stdout io.Writer) func(string) (bool, error) {
	return func(question string) (bool, error) {
		if !term.IsTerminal(int(os.Stdin.Fd())) {
			return false, errNoTerminal
		}
		return ask(os.Stdin, stdout, question)
	}
}

// errNoTerminal: there is no terminal to ask on.
var errNoTerminal = errors.New("no terminal")

// ask writes question and reads the answer: y or yes goes on.
func ask(in io.Reader, out io.Writer, question string) (bool, error) {
	fmt.Fprintf(out, "%s [y/N] ", question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(out)
		return false, nil
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}

// proceed asks before the action (unless --yes) and says why it stops.
func (a *dlqAction) proceed(question string) (bool, error) {
	if a.yes {
		return true, nil
	}
	ok, err := a.confirm(question)
	if errors.Is(err, errNoTerminal) {
		return false, usagef("%s; there is no terminal to ask on: pass --yes to %s them (or --dry-run to list them); nothing changed", question, a.action)
	}
	if err != nil {
		return false, err
	}
	if !ok {
		fmt.Fprintln(a.stdout, "not confirmed: nothing changed")
	}
	return ok, nil
}

// relay lists, shows, redrives or discards relay dead letters. Redrive
// and discard act on exactly what list shows with the same flags (the
// newest --limit that match), each dead letter by its feed and event.
func (a *dlqAction) relay(ctx context.Context, drv ferrydriver.Store, ids []uuid.UUID, p *ferrydriver.ListDeadLettersParams) error {
	if a.action == "show" {
		dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Feed: p.Feed, EventIDs: ids, Limit: 1000})
		if err != nil {
			return err
		}
		if len(dls) == 0 {
			return fmt.Errorf("no relay dead letter with event ID %s (list them with `ferry dlq list`; a consumer group's with --group)", ids[0])
		}
		return printDeadLetters(a.stdout, dls, a.asJSON, true)
	}
	dls, err := drv.ListDeadLetters(ctx, p)
	if err != nil {
		return err
	}
	total, err := drv.CountDeadLetters(ctx, p)
	if err != nil {
		return err
	}
	if a.action == "list" {
		if err := printDeadLetters(a.stdout, dls, a.asJSON, false); err != nil {
			return err
		}
		if !a.asJSON && len(dls) > 0 {
			fmt.Fprintf(a.stdout, "showing %s of %s relay dead letter(s), newest first%s\n", thousands(int64(len(dls))), thousands(total), moreHint(len(dls), total))
		}
		return nil
	}
	if len(dls) == 0 {
		fmt.Fprintln(a.stdout, "no relay dead letters match; nothing changed")
		return nil
	}
	what := fmt.Sprintf("%s %s relay dead letter(s) (of %s that match, the newest; from %s)", verbOf(a.action), thousands(int64(len(dls))), thousands(total), byFeed(dls))
	if a.dryRun {
		if err := printDeadLetters(a.stdout, dls, a.asJSON, false); err != nil {
			return err
		}
		if !a.asJSON {
			fmt.Fprintf(a.stdout, "%d relay dead letter(s) would be %s, of %s that match; nothing changed (--dry-run)\n", len(dls), pastTense(a.action), thousands(total))
		}
		return nil
	}
	if ok, err := a.proceed(what + "?"); !ok || err != nil {
		return err
	}
	sel := driverkit.Refs(dls)
	var n int
	if a.action == "redrive" {
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
	}[a.action]
	fmt.Fprintf(a.stdout, "%d relay dead letter(s) %s\n", n, verb)
	if a.action == "redrive" {
		// A feed no relay leads publishes them when one runs.
		seen := map[string]bool{}
		for _, d := range dls {
			if seen[d.Feed] {
				continue
			}
			seen[d.Feed] = true
			if l, err := drv.GetLease(ctx, d.Feed); err != nil || !l.ExpiresAt.After(l.Now) {
				fmt.Fprintf(a.stdout, "no relay leads feed %s now: its redriven events wait for one (ferry parked list --feed %s shows them)\n", d.Feed, d.Feed)
			}
		}
	}
	if rest := total - int64(n); rest > 0 {
		fmt.Fprintf(a.stdout, "%s more match: run it again for the next %d\n", thousands(rest), len(dls))
	}
	return nil
}

// group lists, shows, redrives or discards a consumer group's dead
// events: exactly what list shows with the same flags.
func (a *dlqAction) group(ctx context.Context, in inboxAdmin, p *ferrydriver.ListInboxParams, filtered bool) error {
	rows, err := in.ListInbox(ctx, p)
	if err != nil {
		return err
	}
	if a.action == "show" {
		if len(rows) == 0 {
			return fmt.Errorf("group %s has no event %s", p.Group, p.EventIDs[0])
		}
		return printInboxRows(a.stdout, rows, a.asJSON, true)
	}
	// How many DEAD rows the group has (to InboxCountCap): the total a
	// page of an unfiltered list is out of.
	total := ""
	if !filtered {
		counts, err := in.InboxCounts(ctx, p.Group)
		if err != nil {
			return err
		}
		total = thousands(counts[ferrydriver.InboxDead])
		if counts[ferrydriver.InboxDead] >= ferrydriver.InboxCountCap {
			total += "+"
		}
	}
	// of says what the rows are out of: " of 12" (the group's DEAD rows),
	// or, filtered, whether more may match.
	of := func() string {
		if total == "" {
			if len(rows) == p.Limit {
				return " (more may match: --limit)"
			}
			return ""
		}
		return " of " + total
	}
	if a.action == "list" {
		if err := printInboxRows(a.stdout, rows, a.asJSON, false); err != nil {
			return err
		}
		if !a.asJSON && len(rows) > 0 {
			fmt.Fprintf(a.stdout, "showing %d%s dead event(s) of group %s, newest first\n", len(rows), of(), p.Group)
		}
		return nil
	}
	if len(rows) == 0 {
		fmt.Fprintf(a.stdout, "no dead letters of group %s match; nothing changed\n", p.Group)
		return nil
	}
	if a.dryRun {
		if err := printInboxRows(a.stdout, rows, a.asJSON, false); err != nil {
			return err
		}
		if !a.asJSON {
			fmt.Fprintf(a.stdout, "%d dead letter(s) of group %s would be %s%s; nothing changed (--dry-run)\n", len(rows), p.Group, pastTense(a.action), of())
		}
		return nil
	}
	if ok, err := a.proceed(fmt.Sprintf("%s %d%s dead event(s) of group %s?", verbOf(a.action), len(rows), of(), p.Group)); !ok || err != nil {
		return err
	}
	sel := &ferrydriver.InboxIDsParams{Group: p.Group}
	for _, r := range rows {
		sel.EventIDs = append(sel.EventIDs, r.Event.ID)
	}
	var n int
	if a.action == "redrive" {
		n, err = in.RedriveInbox(ctx, sel)
	} else {
		n, err = in.DiscardInbox(ctx, sel)
	}
	if err != nil {
		return err
	}
	verb := map[string]string{"redrive": "redriven: they run again, first in their keys' order", "discard": "discarded: their keys are released"}[a.action]
	fmt.Fprintf(a.stdout, "%d dead letter(s) of group %s %s\n", n, p.Group, verb)
	return nil
}

func verbOf(action string) string {
	return map[string]string{"redrive": "Redrive", "discard": "Discard"}[action]
}

func pastTense(action string) string {
	return map[string]string{"redrive": "redriven", "discard": "discarded"}[action]
}

// byFeed says how many of dls each feed holds: "hooks/0 (98), default/0 (2)".
func byFeed(dls []*ferrydriver.DeadLetter) string {
	n := map[string]int{}
	var feeds []string
	for _, d := range dls {
		if n[d.Feed] == 0 {
			feeds = append(feeds, d.Feed)
		}
		n[d.Feed]++
	}
	parts := make([]string, len(feeds))
	for i, f := range feeds {
		parts[i] = fmt.Sprintf("%s (%d)", f, n[f])
	}
	return strings.Join(parts, ", ")
}

func moreHint(shown int, total int64) string {
	if int64(shown) < total {
		return "; --limit shows more, the filters narrow"
	}
	return ""
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
	fmt.Fprintln(tw, "FAILED AT\tFEED\tEVENT ID\tTOPIC\tKEY\tTYPE\tREASON")
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.FailedAt.Format(time.RFC3339), d.Feed, d.Event.ID, d.Event.Topic, d.Event.Key, d.Event.Type, preview([]byte(firstLine(d.Reason)), 80))
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
