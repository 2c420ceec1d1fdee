package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
)

// `ferry status` estimates the lag beyond ExactCountLimit events, says
// so, and counts it all with --exact.
func TestStatusSaysWhichFiguresAreEstimates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	drv, err := ferrysqlite.Open(path, nil)
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	n := 2*ferrydriver.ExactCountLimit + 500
	var evs []*ferryevent.Event
	for i := range n {
		evs = append(evs, ferrydrivertest.Event("t", "k"+strconv.Itoa(i%9), ""))
	}
	require.NoError(t, drv.Append(ctx, evs))
	require.NoError(t, drv.Close())
	db := []string{"--database-url", "sqlite:" + path}

	out, code := ferryCmd(t, append([]string{"status"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "~"+strconv.Itoa(n), "one partition without gaps: the estimate is the count, marked as an estimate")
	require.Contains(t, out, "--exact counts them all")

	out, code = ferryCmd(t, append([]string{"status", "--json"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"lag_estimated": true`)

	out, code = ferryCmd(t, append([]string{"status", "--exact"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, " "+strconv.Itoa(n)+" ")
	require.NotContains(t, out, "~")
}

// TestStatusShowsEveryFeedAndGroup: `ferry status` shows every feed that
// has a checkpoint, a lease or dead letters (not only --feed's, which
// defaulted to "default": a webhook feed with dead letters was
// invisible), and the consumer groups; --feed takes a feed's name for
// every partition of it or a partition's, and means the same in
// `ferry dlq list` and `ferry parked list`.
func TestStatusShowsEveryFeedAndGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := ferrypgtest.Schema(t)
	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	_, err = drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/0", Holder: "nats-relay", TTL: time.Minute})
	require.NoError(t, err)
	l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "hooks/0", Holder: "webhook-relay", TTL: time.Minute})
	require.NoError(t, err)
	refused := ferrydrivertest.Event("orders", "k1", "x")
	require.NoError(t, drv.InsertDeadLetters(ctx, &ferrydriver.InsertDeadLettersParams{Feed: "hooks/0", Holder: "webhook-relay", Term: l.Term,
		DeadLetters: []*ferrydriver.DeadLetter{{Event: *refused, Reason: "410 Gone"}}}))
	dead := ferrydrivertest.Event("orders", "k2", "y")
	_, err = drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "billing", Events: []*ferryevent.Event{dead}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "billing", Worker: "w", Limit: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, drv.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "billing", EventID: rows[0].Event.ID, Claim: rows[0].Claim, Error: "boom", Dead: true}))

	code, out, errOut := ferryBinary(t, append([]string{"status"}, db...)...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^default/0 .*nats-relay`, out, "the default feed")
	require.Regexp(t, `(?m)^hooks/0 .*webhook-relay.* 1\s*$`, out, "feed hooks, its lease and its dead letter")
	require.Regexp(t, `(?m)^GROUP\s+PENDING\s+PROCESSING\s+RETRYING\s+DEAD`, out, "the consumer groups")
	require.Regexp(t, `(?m)^billing\s+0\s+0\s+0\s+1\s+hold`, out)

	code, out, errOut = ferryBinary(t, append([]string{"status", "--feed", "hooks", "--json"}, db...)...)
	require.Equal(t, 0, code, errOut)
	var st statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Len(t, st.Feeds, 1)
	require.Equal(t, "hooks/0", st.Feeds[0].Feed)
	require.EqualValues(t, 1, st.Feeds[0].DeadLetters)

	for _, f := range []string{"hooks", "hooks/0"} {
		code, out, errOut = ferryBinary(t, append([]string{"dlq", "list", "--feed", f}, db...)...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, refused.ID.String(), "--feed %s: the feed's dead letters", f)
	}
	code, out, errOut = ferryBinary(t, append([]string{"parked", "list", "--feed", "hooks"}, db...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no key is parked (in hooks/0)")
}
