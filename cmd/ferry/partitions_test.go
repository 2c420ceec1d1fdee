package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/stretchr/testify/require"
)

// TestPartitionsCommand: `ferry migrate up --partitions 4` stores the
// count, which the other commands then follow; `ferry partitions set`
// refuses while events are undelivered, saying what to do, and changes the
// count once every feed has delivered them; emits then go by the new
// count, and status reports every partition.
func TestPartitionsCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := ferrypgtest.Schema(t)
	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	cmd := func(args ...string) (string, int) { return ferryCmd(t, append(args, db...)...) }

	out, code := cmd("migrate", "up", "--partitions", "4")
	require.Equal(t, 0, code, out)
	out, code = cmd("partitions", "show")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "schema "+schema+" has 4 partition(s)")

	out, code = cmd("emit", "--topic", "orders", "--key", "o-1", "--type", "OrderPlaced", "--count", "3")
	require.Equal(t, 0, code, out)
	out, code = cmd("status", "--partitions", "2")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "--partitions / FERRY_PARTITIONS")
	require.Contains(t, out, "has 4 partition(s)")

	out, code = cmd("partitions", "set", "8")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "could reorder a key's events")
	require.Contains(t, out, "no feed has read it")
	require.Contains(t, out, "Stop the producers")
	out, code = cmd("partitions", "set")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "ferry partitions set N")
	out, code = cmd("partitions", "set", "0")
	require.Equal(t, 2, code, out)

	// Relays deliver everything and stop.
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	for p := range 4 {
		name := "default/" + strconv.Itoa(p)
		l, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "relay", TTL: time.Minute})
		require.NoError(t, err)
		f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: name, Partition: p})
		require.NoError(t, err)
		cursor := readAll(ctx, t, f)
		require.NoError(t, f.Close())
		require.NoError(t, drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: name, Partition: p, Cursor: cursor, Holder: "relay", Term: l.Term}))
		require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: "relay", Term: l.Term}))
	}
	out, code = cmd("partitions", "set", "8")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "now has 8 partition(s) (was 4)")
	out, code = cmd("partitions", "set", "8")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "already has 8")

	out, code = cmd("emit", "--topic", "orders", "--key", "o-1", "--type", "OrderPlaced")
	require.Equal(t, 0, code, out)
	out, code = cmd("status", "--json")
	require.Equal(t, 0, code, out)
	var st statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Len(t, st.Feeds, 8, "one feed per stored partition")
	for p, s := range st.Feeds {
		want := int64(0)
		if p == ferrydriver.PartitionOf("o-1", 8) {
			want = 1
		}
		require.Equal(t, want, s.LagEvents, "%s", s.Feed)
		require.Equal(t, 8, s.PartitionsTotal)
	}
}

// readAll reads a feed until it is quiet and returns its position.
func readAll(ctx context.Context, t *testing.T, f ferrydriver.Feed) []byte {
	var cursor []byte
	for empty := 0; empty < 2; {
		b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 100, Wait: 20 * time.Millisecond})
		require.NoError(t, err)
		cursor = b.Cursor
		if len(b.Events) == 0 {
			empty++
		}
	}
	return cursor
}

// `ferry relay --partitions` that differs from the stored count is refused
// at once, naming the flag. (A --partition outside the count ends the relay
// with the feed's error: TestRelayOnAPartitionTheSchemaLacksExits.)
func TestRelayWithAnotherPartitionCountIsRefused(t *testing.T) {
	t.Setenv("FERRY_WEBHOOK_UNSIGNED", "true")
	db := []string{"--database-url", "sqlite:" + filepath.Join(t.TempDir(), "app.db")}
	out, code := ferryCmd(t, append([]string{"migrate", "up", "--partitions", "2"}, db...)...)
	require.Equal(t, 0, code, out)
	out, code = ferryCmd(t, append([]string{"relay", "--partitions", "3", "--metrics-addr", "off", "--sink-url", "http://127.0.0.1:1/hook"}, db...)...)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "--partitions / FERRY_PARTITIONS (database.partitions in ferry.yaml) is 3")
}

// On SQLite: migrate stores --partitions, show reports it, set changes it
// while the outbox is empty, and `migrate sql` prints the count given.
func TestPartitionsCommandSQLite(t *testing.T) {
	t.Parallel()
	db := []string{"--database-url", "sqlite:" + filepath.Join(t.TempDir(), "app.db")}
	cmd := func(args ...string) (string, int) { return ferryCmd(t, append(args, db...)...) }
	out, code := cmd("migrate", "up", "--partitions", "2")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "applied 004_settings")
	out, code = cmd("partitions", "show")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "has 2 partition(s)")
	out, code = cmd("partitions", "set", "3")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "now has 3 partition(s) (was 2)")
	out, code = cmd("status", "--json")
	require.Equal(t, 0, code, out)
	var st statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Len(t, st.Feeds, 3)
	out, code = cmd("migrate", "sql", "--partitions", "5")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "NULLIF(5, 0)")
}
