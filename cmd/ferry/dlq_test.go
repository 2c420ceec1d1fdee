package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
)

func ferryCmd(t *testing.T, args ...string) (string, int) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return out.String() + errOut.String(), code
}

func TestDLQForAConsumerGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := ferrypgtest.Schema(t)
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	bad := &ferryevent.Event{Topic: "orders", Key: "k1", Type: "OrderPlaced", Payload: []byte(`{"x":1}`)}
	next := &ferryevent.Event{Topic: "orders", Key: "k1", Type: "OrderPlaced", Payload: []byte(`{"x":2}`)}
	require.NoError(t, ferryevent.Prepare(bad, 0, 0, time.Now()))
	require.NoError(t, ferryevent.Prepare(next, 1, 0, time.Now()))
	_, err = drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "billing", Events: []*ferryevent.Event{bad, next}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "billing", Worker: "w", Limit: 5, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "billing", EventID: rows[0].Event.ID, Claim: rows[0].Claim, Error: "card declined\nstack...", Dead: true}))

	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	out, code := ferryCmd(t, append([]string{"dlq", "list", "--group", "billing"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, bad.ID.String())
	require.Contains(t, out, "card declined")
	require.NotContains(t, out, "stack...", "the list shows the first line of the error")

	out, code = ferryCmd(t, append([]string{"dlq", "show", "--group", "billing", bad.ID.String()}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "dead after 1 attempt(s)")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--all", "--yes"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "no relay dead letters match", "without --group: the relay's")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--group", "billing", "--topic", "orders"}, db...)...)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "--feed, --topic and --reason select relay dead letters", "a filter that does not apply is refused, not ignored")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--group", "billing", "--key", "k1", "--dry-run"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, bad.ID.String())
	require.Contains(t, out, "1 dead letter(s) of group billing would be redriven; nothing changed")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--group", "billing", "--key", "k1", "--yes"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "1 dead letter(s) of group billing redriven")
	rows, err = drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "billing", Worker: "w", Limit: 5, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, bad.ID, rows[0].Event.ID, "the redriven event runs first in its key")

	out, code = ferryCmd(t, append([]string{"dlq", "list"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "no relay dead letters")
}

// TestDLQRedriveAndDiscardForTheRelay: without --group, redrive and
// discard act on the relay's dead letters, exactly those `list` shows with
// the same flags; --dry-run changes nothing; a redriven event waits, with
// its ID, for the feed that dead-lettered it.
func TestDLQRedriveAndDiscardForTheRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := ferrypgtest.Schema(t)
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	mk := func(topic, key, payload string) *ferryevent.Event {
		ev := &ferryevent.Event{Topic: topic, Key: key, Type: "OrderPlaced", Payload: []byte(payload)}
		require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
		return ev
	}
	big, other, gone := mk("orders", "k1", "too big"), mk("orders", "k2", "x"), mk("audit", "k3", "y")
	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "r", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: "default/0", Holder: "r", Term: l.Term,
		DeadLetters: []*ferrydriver.DeadLetter{{Event: *big, Reason: "message too large"}, {Event: *other, Reason: "unroutable"}, {Event: *gone, Reason: "unroutable"}}}))
	later := mk("orders", "k1", "later")
	require.NoError(t, drv.Append(ctx, []*ferryevent.Event{later}))

	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	out, code := ferryCmd(t, append([]string{"dlq", "redrive", "--key", "k1", "--dry-run"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, big.ID.String())
	require.NotContains(t, out, other.ID.String())
	require.Contains(t, out, "1 relay dead letter(s) would be redriven, of 1 that match; nothing changed")
	dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Len(t, dls, 3, "--dry-run changed nothing")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--feed", "default/0", "--key", "k1", "--yes"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "1 relay dead letter(s) redriven")
	require.NotContains(t, out, "no relay leads feed default/0", "its lease is held")
	got := ferrydrivertest.OpenReader(ctx, t, drv, nil).ReadQuiet(ctx)
	require.Len(t, got, 1, "nothing appended to the outbox, which every feed reads")
	require.Equal(t, later.ID, got[0].ID)
	heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "default/0", Redriven: true})
	require.NoError(t, err)
	require.Len(t, heads, 1, "queued for feed default/0 only")
	require.Equal(t, big.ID, heads[0].Event.ID, "the same event ID")

	out, code = ferryCmd(t, append([]string{"dlq", "discard", gone.ID.String(), "--yes"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "1 relay dead letter(s) discarded")
	out, code = ferryCmd(t, append([]string{"dlq", "list"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, other.ID.String())
	require.NotContains(t, out, big.ID.String())
	require.NotContains(t, out, gone.ID.String())
	out, code = ferryCmd(t, append([]string{"dlq", "discard", "--topic", "audit", "--yes"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "no relay dead letters match")
}

// TestDLQVerbsRefuseWithoutASelection runs the binary: `ferry dlq
// redrive` and `ferry dlq discard`, with --dry-run or not, select nothing
// unless told on the command line what to (a variable in the environment
// is not enough): they exit 2 with one line that says how, and change
// nothing. A selection says how many it selected of how many match and,
// with no terminal to ask on, acts only with --yes. `dlq list` says how
// many it shows of how many match, with the feed of each; an unknown
// --group or --feed is named as such.
func TestDLQVerbsRefuseWithoutASelection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := ferrypgtest.Schema(t)
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	insert := func(feed string, n int) *ferrydriver.Lease {
		l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "r", TTL: time.Minute})
		require.NoError(t, err)
		var dls []*ferrydriver.DeadLetter
		for i := range n {
			dls = append(dls, &ferrydriver.DeadLetter{Event: *ferrydrivertest.Event("orders", fmt.Sprintf("%s-%d", feed, i), "x"), Reason: "410 Gone"})
		}
		require.NoError(t, drv.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: feed, Holder: "r", Term: l.Term, DeadLetters: dls}))
		return l
	}
	insert("hooks/0", 3)
	hooks1 := insert("hooks/1", 1000)
	insert("default/0", 1)
	dead := ferrydrivertest.Event("orders", "g1", "y")
	_, err = drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "billing", Events: []*ferryevent.Event{dead}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "billing", Worker: "w", Limit: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "billing", EventID: rows[0].Event.ID, Claim: rows[0].Claim, Error: "boom", Dead: true}))
	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	unchanged := func(letters int64) {
		t.Helper()
		n, err := drv.CountDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
		require.NoError(t, err)
		require.Equal(t, letters, n, "relay dead letters")
		counts, err := drv.InboxCounts(ctx, "billing")
		require.NoError(t, err)
		require.EqualValues(t, 1, counts[ferrydriver.InboxDead], "billing's dead event")
		heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "hooks/0"})
		require.NoError(t, err)
		require.Empty(t, heads, "nothing redriven")
	}

	for _, verb := range []string{"redrive", "discard"} {
		for _, extra := range [][]string{nil, {"--dry-run"}, {"--limit", "5"}, {"--yes"}, {"--json"}} {
			code, out, errOut := ferryBinary(t, append(append([]string{"dlq", verb}, extra...), db...)...)
			require.Equal(t, 2, code, "ferry dlq %s %v: %s%s", verb, extra, out, errOut)
			require.Empty(t, out)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %s", errOut)
			require.Contains(t, errOut, "say which dead letters to "+verb+": event IDs, --feed, --group, --key, --type, --topic, --reason, --since or --before, or --all")
			require.Contains(t, errOut, "nothing changed")
		}
		code, _, errOut := ferryBinaryEnv(t, []string{"FERRY_FEED=hooks", "FERRY_GROUP=billing"}, append([]string{"dlq", verb, "--yes"}, db...)...)
		require.Equal(t, 2, code, "variables in the environment select nothing: %s", errOut)
		require.Contains(t, errOut, "say which dead letters")
	}
	unchanged(1004)

	// A selection, no terminal to ask on, no --yes: the count, and nothing done.
	code, out, errOut := ferryBinary(t, append([]string{"dlq", "redrive", "--feed", "hooks"}, db...)...)
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, errOut, "Redrive 100 relay dead letter(s) (of 1,003 that match, the newest; from hooks/")
	require.Contains(t, errOut, "pass --yes to redrive them")
	code, out, errOut = ferryBinary(t, append([]string{"dlq", "discard", "--group", "billing"}, db...)...)
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, errOut, "Discard 1 of 1 dead event(s) of group billing?")
	code, out, errOut = ferryBinary(t, append([]string{"dlq", "redrive", "--all", "--feed", "hooks"}, db...)...)
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, errOut, "--all selects every dead letter")
	unchanged(1004)

	// list: how many of how many, each with its feed; unknown names said so.
	code, out, errOut = ferryBinary(t, append([]string{"dlq", "list"}, db...)...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^FAILED AT\s+FEED\s+EVENT ID`, out)
	require.Contains(t, out, "showing 100 of 1,004 relay dead letter(s), newest first")
	code, out, errOut = ferryBinary(t, append([]string{"dlq", "list", "--feed", "hooks/0"}, db...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "showing 3 of 3 relay dead letter(s)")
	code, out, errOut = ferryBinary(t, append([]string{"dlq", "list", "--group", "nosuchgroup"}, db...)...)
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, errOut, "--group nosuchgroup: the group does not exist")
	require.Contains(t, errOut, "(the groups: billing)")
	code, out, errOut = ferryBinary(t, append([]string{"dlq", "list", "--feed", "nosuch"}, db...)...)
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, errOut, "--feed nosuch: no feed of that name")
	require.Contains(t, errOut, "default, hooks")

	// With --yes: done, on what was selected only.
	code, out, errOut = ferryBinary(t, append([]string{"dlq", "redrive", "--feed", "hooks/0", "--yes"}, db...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "3 relay dead letter(s) redriven")
	require.NotContains(t, out, "no relay leads feed hooks/0", "its lease is held")
	n, err := drv.CountDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.EqualValues(t, 1001, n, "hooks/1's and default/0's stay")
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: "hooks/1", Holder: "r", Term: hooks1.Term}))
	code, out, errOut = ferryBinary(t, append([]string{"dlq", "redrive", "--feed", "hooks/1", "--limit", "1", "--yes"}, db...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no relay leads feed hooks/1 now: its redriven events wait for one")
	code, out, errOut = ferryBinary(t, append([]string{"dlq", "discard", "--all", "--yes", "--limit", "600"}, db...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "600 relay dead letter(s) discarded")
	require.Contains(t, out, "400 more match: run it again")

	// -h says the rules.
	code, _, errOut = ferryBinary(t, "dlq", "discard", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, errOut, "Selection: ferry dlq discard acts only on dead letters you select")
	require.Contains(t, errOut, "--yes answers for scripts")
}

// ask reads a yes (y, yes) as go; anything else, or nothing, as no.
func TestDLQAskTakesOnlyAYes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{"y\n": true, "YES\n": true, " yes \n": true, "n\n": false, "\n": false, "": false, "yep\n": false} {
		var out bytes.Buffer
		ok, err := ask(strings.NewReader(in), &out, "Redrive 3?")
		require.NoError(t, err)
		require.Equal(t, want, ok, "%q", in)
		require.True(t, strings.HasPrefix(out.String(), "Redrive 3? [y/N] "))
	}
}
