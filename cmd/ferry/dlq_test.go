package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/internal/pgtest"
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
	schema := pgtest.Schema(t)
	drv, err := ferrypg.New(pgtest.Pool(t), &ferrypg.Config{Schema: schema})
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

	db := []string{"--database-url", pgtest.URL(), "--schema", schema}
	out, code := ferryCmd(t, append([]string{"dlq", "list", "--group", "billing"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, bad.ID.String())
	require.Contains(t, out, "card declined")
	require.NotContains(t, out, "stack...", "the list shows the first line of the error")

	out, code = ferryCmd(t, append([]string{"dlq", "show", "--group", "billing", bad.ID.String()}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "dead after 1 attempt(s)")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "no relay dead letters match", "without --group: the relay's")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--group", "billing", "--topic", "orders"}, db...)...)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "--topic selects relay dead letters", "a filter that does not apply is refused, not ignored")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--group", "billing", "--key", "k1", "--dry-run"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, bad.ID.String())
	require.Contains(t, out, "1 dead letter(s) of group billing would be redriven; nothing changed")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--group", "billing", "--key", "k1"}, db...)...)
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
	schema := pgtest.Schema(t)
	drv, err := ferrypg.New(pgtest.Pool(t), &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	mk := func(topic, key, payload string) *ferryevent.Event {
		ev := &ferryevent.Event{Topic: topic, Key: key, Type: "OrderPlaced", Payload: []byte(payload)}
		require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
		return ev
	}
	big, other, gone := mk("orders", "k1", "too big"), mk("orders", "k2", "x"), mk("audit", "k3", "y")
	l, err := drv.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: "default/0", Holder: "r", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: "default/0", Holder: "r", Term: l.Term,
		DeadLetters: []*ferrydriver.DeadLetter{{Event: *big, Reason: "message too large"}, {Event: *other, Reason: "unroutable"}, {Event: *gone, Reason: "unroutable"}}}))
	later := mk("orders", "k1", "later")
	require.NoError(t, drv.Append(ctx, &ferrydriver.AppendParams{Events: []*ferryevent.Event{later}}))

	db := []string{"--database-url", pgtest.URL(), "--schema", schema}
	out, code := ferryCmd(t, append([]string{"dlq", "redrive", "--key", "k1", "--dry-run"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, big.ID.String())
	require.NotContains(t, out, other.ID.String())
	require.Contains(t, out, "1 relay dead letter(s) would be redriven; nothing changed")
	dls, err := drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{})
	require.NoError(t, err)
	require.Len(t, dls, 3, "--dry-run changed nothing")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--feed", "default/0", "--key", "k1"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "1 relay dead letter(s) redriven")
	got := ferrydrivertest.OpenReader(ctx, t, drv, nil).ReadQuiet(ctx)
	require.Len(t, got, 1, "nothing appended to the outbox, which every feed reads")
	require.Equal(t, later.ID, got[0].ID)
	heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "default/0", Redriven: true})
	require.NoError(t, err)
	require.Len(t, heads, 1, "queued for feed default/0 only")
	require.Equal(t, big.ID, heads[0].Event.ID, "the same event ID")

	out, code = ferryCmd(t, append([]string{"dlq", "discard", gone.ID.String()}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "1 relay dead letter(s) discarded")
	out, code = ferryCmd(t, append([]string{"dlq", "list"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, other.ID.String())
	require.NotContains(t, out, big.ID.String())
	require.NotContains(t, out, gone.ID.String())
	out, code = ferryCmd(t, append([]string{"dlq", "discard", "--topic", "audit"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "no relay dead letters match")
}
