package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// maxParkedShown bounds the parked keys `ferry parked list` and `ferry
// status` read: as many as a relay loads, and a bounded read whatever the
// table holds.
const maxParkedShown = 100_000

// cmdParked lists and releases the keys a relay parked: keys whose
// destination stopped acknowledging them while other keys flowed, set
// aside in the database and published from there once the destination
// answers; held ones (DeadPolicy hold) wait for an operator.

func cmdParked(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, err := pickSubcommand("parked", args, []subcommand{
		{"list", "keys set aside while their destination failed, held ones, and redriven dead letters waiting (--feed hooks, or hooks/0)"},
		{"release", "release <key>: retry a held key's head"},
		{"skip", "skip <key>: dead-letter a held key's head and let the key go on"},
	}, stdout)
	if err != nil {
		return err
	}
	f := newFlags("parked "+action, stderr)
	f.AcceptArgs()
	var db dbFlags
	db.register(f)
	var feed string
	var asJSON bool
	f.String(&feed, "feed", "FERRY_FEED", "", "only this feed: a feed's name (hooks: every partition of it) or a partition's (hooks/0); default: every feed")
	f.Bool(&asJSON, "json", "FERRY_PARKED_JSON", false, "print JSON (list)")
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	feeds, err := driverkit.RelayFeeds(ctx, b.store, feed)
	if err != nil {
		return err
	}
	if action == "list" {
		var heads []*ferrydriver.ParkedEvent
		for _, name := range feeds {
			hs, err := b.store.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: name, Limit: maxParkedShown})
			if err != nil {
				return err
			}
			heads = append(heads, hs...)
		}
		if asJSON {
			out := make([]parkedJSON, 0, len(heads))
			for _, h := range heads {
				out = append(out, parkedJSON{Feed: h.Feed, Key: h.Event.Key, Events: h.Queued, Head: h.Event.ID.String(), ParkedAt: h.ParkedAt, Held: h.Held, Redriven: h.Redriven, Reason: h.Reason})
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		}
		if len(heads) == 0 {
			fmt.Fprintf(stdout, "no key is parked (in %s)\n", strings.Join(feeds, ", "))
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FEED\tKEY\tEVENTS\tSTATE\tPARKED AT\tHEAD EVENT\tLAST ERROR")
		for _, h := range heads {
			state := "retrying"
			switch {
			case h.Held:
				state = "held"
			case h.Redriven:
				state = "redriven"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", h.Feed, h.Event.Key, h.Queued, state, h.ParkedAt.Format(time.RFC3339), h.Event.ID, h.Reason)
		}
		return tw.Flush()
	}
	keys := f.Args()
	if len(keys) == 0 {
		return usagef("name the key: ferry parked %s <key> (--feed hooks/0 when several feeds have it parked)", action)
	}
	for _, key := range keys {
		// The feed partitions that have the key parked: an action reaches
		// one of them only.
		var where []string
		for _, name := range feeds {
			hs, err := b.store.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: name, Keys: []string{key}})
			if err != nil {
				return err
			}
			if len(hs) > 0 {
				where = append(where, name)
			}
		}
		switch len(where) {
		case 0:
			return fmt.Errorf("key %q has nothing parked in %s: see `ferry parked list`", key, strings.Join(feeds, ", "))
		case 1:
		default:
			return usagef("key %q is parked in %s: name the one to act on with --feed (e.g. --feed %s)", key, strings.Join(where, " and "), where[0])
		}
		if err := b.store.ReleaseParked(ctx, &ferrydriver.ReleaseParkedParams{Feed: where[0], Key: key, Skip: action == "skip"}); err != nil {
			return err
		}
		if action == "skip" {
			fmt.Fprintf(stdout, "%s (%s): its oldest parked event is now a dead letter (`ferry dlq show`); the relay goes on with the next\n", key, where[0])
		} else {
			fmt.Fprintf(stdout, "%s (%s): released; the relay retries it within a heartbeat\n", key, where[0])
		}
	}
	return nil
}
