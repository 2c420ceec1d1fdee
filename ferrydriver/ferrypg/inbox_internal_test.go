package ferrypg

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
			group, 1, "w", time.Minute.Milliseconds(), uuid.NewString(), 0, ferrydriver.ReasonAttemptsExhausted).Scan(&raw))
		claimBuf, _ = planBuffers(t, raw)
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.inboxRefreshKey, group, "hot").Scan(&raw))
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

// TestAwaitSettledFailsWhenItCannotListen: a settlement listener that never
// manages to LISTEN (here: the pool's database does not exist) makes
// AwaitSettled return an error after its deadline, not "pending" for
// everything, and the failure is logged.
func TestAwaitSettledFailsWhenItCannotListen(t *testing.T) {
	t.Parallel()
	pgtest.Pool(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Database = "ferry_no_such_database"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	var logs strings.Builder
	var mu sync.Mutex
	drv, err := New(pool, &Config{Schema: "ferry_test_nolisten", Logger: slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))})
	require.NoError(t, err)
	start := time.Now()
	_, err = drv.AwaitSettled(context.Background(), &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{uuid.New()}, Deadline: time.Now().Add(time.Second)})
	require.ErrorIs(t, err, errNotListening)
	require.ErrorContains(t, err, "ferry_no_such_database")
	require.Less(t, time.Since(start), 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, logs.String(), "the settlement listener cannot LISTEN")
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestSettlementHubStaysForSporadicCallers: calls a few seconds apart share
// one listening session instead of opening one each.
func TestSettlementHubStaysForSporadicCallers(t *testing.T) {
	t.Parallel()
	drv := newTestDriver(t)
	ctx := context.Background()
	for range 3 {
		_, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{uuid.New()}, Deadline: time.Now().Add(100 * time.Millisecond)})
		require.NoError(t, err)
		time.Sleep(200 * time.Millisecond)
	}
	drv.hub.mu.Lock()
	defer drv.hub.mu.Unlock()
	require.Equal(t, 1, drv.hub.sessions, "one listening session for the three calls")
	require.True(t, drv.hub.running, "still listening, idle, for the next caller")
}
