package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
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
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "billing", Worker: "w", Limit: 5, TTL: time.Minute, HoldDead: true})
	require.NoError(t, err)
	require.NoError(t, drv.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "billing", EventID: rows[0].Event.ID, Worker: "w", Error: "card declined\nstack...", Dead: true, HoldDead: true}))

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
	require.Equal(t, 2, code)
	require.Contains(t, out, "add --group")

	out, code = ferryCmd(t, append([]string{"dlq", "redrive", "--group", "billing", "--key", "k1"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "1 dead letter(s) of group billing redriven")
	rows, err = drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "billing", Worker: "w", Limit: 5, TTL: time.Minute, HoldDead: true})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, bad.ID, rows[0].Event.ID, "the redriven event runs first in its key")

	out, code = ferryCmd(t, append([]string{"dlq", "list"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "no relay dead letters")
}
