package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// cmdParked lists and releases the keys a relay parked: keys whose
// destination stopped acknowledging them while other keys flowed, set
// aside in the database and published from there once the destination
// answers; held ones (DeadPolicy hold) wait for an operator.
func cmdParked(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, err := pickSubcommand("parked", args, []subcommand{
		{"list", "keys set aside while their destination failed, and held ones (--feed default/0)"},
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
	f.String(&feed, "feed", "FERRY_FEED", "default/0", "the relay's feed and partition, <feed>/<partition>")
	f.Bool(&asJSON, "json", "FERRY_PARKED_JSON", false, "print JSON (list)")
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	pk, ok := b.store.(ferrydriver.Parker)
	if !ok {
		return fmt.Errorf("the %s backend does not park keys: a stuck key stays in the relay's memory and holds its checkpoint until it is delivered or dead-lettered", b.store.Name())
	}
	if action == "list" {
		heads, err := pk.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: feed, Limit: 100000})
		if err != nil {
			return err
		}
		if asJSON {
			out := make([]parkedJSON, 0, len(heads))
			for _, h := range heads {
				out = append(out, parkedJSON{Key: h.Event.Key, Events: h.Queued, Head: h.Event.ID.String(), ParkedAt: h.ParkedAt, Held: h.Held, Reason: h.Reason})
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		}
		if len(heads) == 0 {
			fmt.Fprintf(stdout, "no key of %s is parked\n", feed)
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tEVENTS\tSTATE\tPARKED AT\tHEAD EVENT\tLAST ERROR")
		for _, h := range heads {
			state := "retrying"
			if h.Held {
				state = "held"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", h.Event.Key, h.Queued, state, h.ParkedAt.Format("2006-01-02 15:04:05"), h.Event.ID, h.Reason)
		}
		return tw.Flush()
	}
	keys := f.Args()
	if len(keys) == 0 {
		return usagef("name the key: ferry parked %s <key> --feed %s", action, feed)
	}
	for _, key := range keys {
		if err := pk.ReleaseParked(ctx, &ferrydriver.ReleaseParkedParams{Feed: feed, Key: key, Skip: action == "skip"}); err != nil {
			return err
		}
		if action == "skip" {
			fmt.Fprintf(stdout, "%s: its oldest parked event is now a dead letter (`ferry dlq show`); the relay goes on with the next\n", key)
		} else {
			fmt.Fprintf(stdout, "%s: released; the relay retries it within a heartbeat\n", key)
		}
	}
	return nil
}
