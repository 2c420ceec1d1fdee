package ferrypg

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/internal/pgtest"
)

// TestInboxClaimIsFlatInAKeysBacklog: claiming a hot key's head, and
// completing it, must cost the same with 100,000 rows behind it as with
// 1,000: the "does another row of this key run?" checks used to walk every
// unfinished row of the key, which made draining a hot key O(n²). Buffers
// are compared, not times.
func TestInboxClaimIsFlatInAKeysBacklog(t *testing.T) {
	t.Parallel()
	n := 100_000
	if testing.Short() {
		n = 30_000
	}
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	pool := pgtest.Pool(t)
	// Group g: one key with n rows; group h: one key with 1,000. Fresh
	// rows both (no dead tuples for a busy VACUUM to leave behind).
	for _, g := range []struct {
		group string
		rows  int
	}{{"g", n}, {"h", 1000}} {
		_, err := pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at)
			SELECT $1, gen_random_uuid(), 'hot', i, 't', 'T', '\x7b7d', now() FROM generate_series(1, $2::int) i`, g.group, g.rows)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key, runnable_at) VALUES ($1, 'hot', now())`, g.group)
		require.NoError(t, err)
	}
	for _, table := range []string{"inbox", "inbox_keys"} {
		_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table)
		require.NoError(t, err)
	}

	// claimAndComplete explains a claim of the head and the refresh of its
	// key after completion, in a transaction rolled back after.
	claimAndComplete := func(group string) (claimBuf, refreshBuf int) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var raw []byte
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.inboxClaim,
			group, 1, "w", time.Minute.Milliseconds(), true, uuid.NewString(), 0, ferrydriver.ReasonAttemptsExhausted).Scan(&raw))
		claimBuf, _ = planBuffers(t, raw)
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.inboxRefreshKey, group, "hot", true).Scan(&raw))
		refreshBuf, _ = planBuffers(t, raw)
		return claimBuf, refreshBuf
	}
	startClaim, startRefresh := claimAndComplete("g")

	// The gauges' counts are capped, and cost O(cap).
	counts, err := drv.InboxCounts(ctx, "g")
	require.NoError(t, err)
	require.Equal(t, int64(ferrydriver.InboxCountCap), counts[ferrydriver.InboxPending])
	var raw []byte
	require.NoError(t, pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.inboxCounts, "g", ferrydriver.InboxCountCap).Scan(&raw))
	countBuf, _ := planBuffers(t, raw)
	t.Logf("counting the gauges over %d pending rows: %d buffers", n, countBuf)
	require.Less(t, countBuf, 1000, "counting reads the states index up to the cap, not the backlog")
	endClaim, endRefresh := claimAndComplete("h")
	t.Logf("a hot key with %d rows behind its head: claim %d buffers, refresh %d; with 1,000: claim %d, refresh %d",
		n, startClaim, startRefresh, endClaim, endRefresh)
	require.Less(t, startClaim, 200, "a claim touches O(1) pages of the key's backlog")
	require.Less(t, startRefresh, 200, "a key refresh touches O(1) pages of the key's backlog")
	require.InDelta(t, startClaim, endClaim, 50)
	require.InDelta(t, startRefresh, endRefresh, 50)
}
