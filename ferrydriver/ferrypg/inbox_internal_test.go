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
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at)
		SELECT 'g', gen_random_uuid(), 'hot', i, 't', 'T', '\x7b7d', now() FROM generate_series(1, $1::int) i`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key, runnable_at) VALUES ('g', 'hot', now())`)
	require.NoError(t, err)
	vacuum := func() {
		_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.inbox`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `VACUUM ANALYZE `+s+`.inbox_keys`)
		require.NoError(t, err)
	}
	vacuum()

	// claimAndComplete explains a claim of the head and the refresh of its
	// key after completion, in a transaction rolled back after.
	claimAndComplete := func() (claimBuf, refreshBuf int) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var raw []byte
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.inboxClaim,
			"g", 1, "w", time.Minute.Milliseconds(), true, uuid.NewString(), 0, ferrydriver.ReasonAttemptsExhausted).Scan(&raw))
		claimBuf, _ = planBuffers(t, raw)
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.inboxRefreshKey, "g", "hot", true).Scan(&raw))
		refreshBuf, _ = planBuffers(t, raw)
		return claimBuf, refreshBuf
	}
	startClaim, startRefresh := claimAndComplete()
	_, err = pool.Exec(ctx, `UPDATE `+s+`.inbox SET state = 'processed', finished_at = now() WHERE key = 'hot' AND seq <= $1`, n-1000)
	require.NoError(t, err)
	vacuum()
	endClaim, endRefresh := claimAndComplete()
	t.Logf("a hot key with %d rows behind its head: claim %d buffers, refresh %d; with 1,000: claim %d, refresh %d",
		n, startClaim, startRefresh, endClaim, endRefresh)
	require.Less(t, startClaim, 200, "a claim touches O(1) pages of the key's backlog")
	require.Less(t, startRefresh, 200, "a key refresh touches O(1) pages of the key's backlog")
	require.InDelta(t, startClaim, endClaim, 50)
	require.InDelta(t, startRefresh, endRefresh, 50)
}
