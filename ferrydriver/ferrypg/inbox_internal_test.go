package ferrypg

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferryevent"
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
	// key after completion, in a transaction rolled back after, under the
	// plans a pgx driver forces (generic) and the session's (custom, as
	// database/sql runs them): the larger buffer count of the two.
	claimAndComplete := func(group string) (claimBuf, refreshBuf int) {
		for _, generic := range []bool{false, true} {
			c := statementBuffers(t, pool, generic, drv.queries.inboxClaim,
				group, 1, "w", time.Minute.Milliseconds(), uuid.NewString(), 0, ferrydriver.ReasonAttemptsExhausted)
			r := statementBuffers(t, pool, generic, drv.queries.inboxRefreshKeyNotify, group, uuid.NewString(), "processed", "ch")
			r2 := statementBuffers(t, pool, generic, drv.queries.inboxRefreshKey, group, "hot")
			claimBuf, refreshBuf = max(claimBuf, c), max(refreshBuf, r, r2)
		}
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

// statementBuffers runs q with args in a transaction rolled back after and
// returns the buffers its plan touched: a generic plan under a pipeline's
// settings when generic is set, the planner's choice for these values
// otherwise.
func statementBuffers(t *testing.T, pool *pgxpool.Pool, generic bool, q string, args ...any) int {
	t.Helper()
	buf, _ := statementCost(t, pool, generic, q, args...)
	return buf
}

// statementCost is statementBuffers, and the rows its plan's nodes looked
// at (returned, or filtered out), a measure of CPU that buffers miss: a
// join that compares every outer row with every inner one in memory
// touches few buffers.
func statementCost(t *testing.T, pool *pgxpool.Pool, generic bool, q string, args ...any) (buffers, rows int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var raw []byte
	if !generic {
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q, args...).Scan(&raw))
		buf, _ := planBuffers(t, raw)
		return buf, planRows(t, raw)
	}
	for _, set := range plannerSettings { // as a pipeline runs its statements
		_, err = tx.Exec(ctx, "SET LOCAL "+set[0]+" = "+set[1])
		require.NoError(t, err)
	}
	// A prepared statement outlives the transaction: a name of its own,
	// deallocated after.
	name := "ferry_explain_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	sd, err := tx.Prepare(ctx, name, q)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE "+name) }()
	require.Len(t, args, len(sd.ParamOIDs))
	values := make([]string, len(args))
	for i, a := range args {
		v := fmt.Sprint(a)
		switch a := a.(type) {
		case nil:
			values[i] = "NULL"
			continue
		case []string:
			v = "{" + strings.Join(a, ",") + "}"
		case time.Time:
			v = a.Format(time.RFC3339Nano)
		}
		values[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'" // EXECUTE takes no parameters of its own
	}
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE "+name+"("+strings.Join(values, ", ")+")").Scan(&raw))
	require.Contains(t, string(raw), "$1", "a generic plan shows its parameters")
	buf, _ := planBuffers(t, raw)
	return buf, planRows(t, raw)
}

// planRows sums, over the nodes of an EXPLAIN ANALYZE (FORMAT JSON) plan,
// the rows each returned and removed by its filters, over all its loops.
func planRows(t *testing.T, raw []byte) int {
	t.Helper()
	var walk func(msg json.RawMessage) float64
	walk = func(msg json.RawMessage) float64 {
		var n struct {
			Rows         float64           `json:"Actual Rows"`
			Loops        float64           `json:"Actual Loops"`
			Filtered     float64           `json:"Rows Removed by Filter"`
			JoinFiltered float64           `json:"Rows Removed by Join Filter"`
			Plans        []json.RawMessage `json:"Plans"`
		}
		require.NoError(t, json.Unmarshal(msg, &n))
		sum := (n.Rows + n.Filtered + n.JoinFiltered) * max(n.Loops, 1)
		for _, p := range n.Plans {
			sum += walk(p)
		}
		return sum
	}
	var plan []struct {
		Plan json.RawMessage
	}
	require.NoError(t, json.Unmarshal(raw, &plan))
	return int(walk(plan[0].Plan))
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

// TestCompletionLeavesTheTransactionsPlanSetting: completion runs its
// statements under generic plans without sequential or bitmap scans, set
// locally in the handler's transaction; the transaction's settings after
// it must be as they were, whatever they were.
func TestCompletionLeavesTheTransactionsPlanSetting(t *testing.T) {
	t.Parallel()
	drv := newTestDriver(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	for _, tc := range []struct {
		name, set, want string
		batch           bool
	}{
		{"default, one event", "", "auto on on", false},
		{"custom, one event", "force_custom_plan", "force_custom_plan off on", false},
		{"default, batch", "", "auto on on", true},
		{"custom, batch", "force_custom_plan", "force_custom_plan off on", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := strings.ReplaceAll(tc.name, " ", "")
			ev := ferrydrivertest.Event("t", "k", "T")
			_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: group, Events: []*ferryevent.Event{ev}})
			require.NoError(t, err)
			rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "w", Limit: 1, TTL: time.Minute, MaxAttempts: 10})
			require.NoError(t, err)
			require.Len(t, rows, 1)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			if tc.set != "" {
				_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+tc.set)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off")
				require.NoError(t, err)
			}
			if tc.batch {
				lost, err := drv.FinishInboxTx(ctx, tx, &ferrydriver.FinishInboxParams{Group: group,
					Rows: []ferrydriver.FinishedRow{{EventID: ev.ID, Claim: rows[0].Claim, State: ferrydriver.InboxProcessed}}})
				require.NoError(t, err)
				require.Empty(t, lost)
			} else {
				require.NoError(t, drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: ev.ID, Claim: rows[0].Claim}))
			}
			var mode string
			require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('plan_cache_mode') || ' ' || current_setting('enable_seqscan') || ' ' || current_setting('enable_bitmapscan')`).Scan(&mode))
			require.Equal(t, tc.want, mode, "plan_cache_mode, enable_seqscan, enable_bitmapscan")
			require.NoError(t, tx.Commit(ctx))
			st, err := drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{ev.ID}})
			require.NoError(t, err)
			require.Equal(t, ferrydriver.InboxProcessed, st[ev.ID].State)
		})
	}
}

// TestInboxPlansOnAnEmptyInbox: a pgx driver runs the inbox's statements
// under generic plans, cached per session and kept until the tables'
// statistics change. Planned on an inbox whose statistics say it is empty
// (a new deployment), they must still touch O(1) pages per event once a
// hot key has 30,000 rows behind its head and the statistics are stale
// (a scan of the inbox would read some 600 pages).
func TestInboxPlansOnAnEmptyInbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 1 // one session: the statements' plans are cached on it
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	drv, err := New(pool, &Config{Schema: pgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	for _, table := range []string{"inbox", "inbox_keys"} {
		_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table)
		require.NoError(t, err)
	}
	// Plan every statement of a claim and of both completions on the empty
	// inbox (a prepared statement's generic plan is made at its first run).
	for range 2 {
		for _, batch := range []bool{false, true} {
			ev := ferrydrivertest.Event("t", "warm", "T")
			_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{ev}})
			require.NoError(t, err)
			rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 1, TTL: time.Minute, MaxAttempts: 10})
			require.NoError(t, err)
			require.Len(t, rows, 1)
			rescued, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 1, TTL: time.Minute, MaxAttempts: 10, Rescue: true})
			require.NoError(t, err)
			require.Empty(t, rescued)
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if batch {
					_, err := drv.FinishInboxTx(ctx, tx, &ferrydriver.FinishInboxParams{Group: "g",
						Rows: []ferrydriver.FinishedRow{{EventID: ev.ID, Claim: rows[0].Claim, State: ferrydriver.InboxProcessed}}})
					return err
				}
				return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: ev.ID, Claim: rows[0].Claim})
			}))
		}
	}
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at)
		SELECT 'g', gen_random_uuid(), CASE WHEN i <= 30000 THEN 'hot' ELSE 'k' || (i % 2) END, i, 't', 'T', '\x7b7d', now()
		  FROM generate_series(1, 31000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key, runnable_at)
		SELECT DISTINCT 'g', key, now() FROM `+s+`.inbox WHERE group_name = 'g' AND state = 'pending'`)
	require.NoError(t, err)
	var head, hot string
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_id::text, (SELECT event_id::text FROM `+s+`.inbox WHERE key = 'hot' ORDER BY pos LIMIT 1)
		FROM `+s+`.inbox WHERE key = 'k0' ORDER BY pos LIMIT 1`).Scan(&head, &hot))

	explain := func(what, query, args string) {
		t.Helper()
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		var name string
		require.NoError(t, conn.QueryRow(ctx, `SELECT name FROM pg_prepared_statements WHERE statement = $1`, query).Scan(&name),
			"the %s statement is prepared on the session", what)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan")
		require.NoError(t, err)
		var raw []byte
		require.NoError(t, tx.QueryRow(ctx, fmt.Sprintf(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE %s(%s)`, pgx.Identifier{name}.Sanitize(), args)).Scan(&raw))
		buffers, _ := planBuffers(t, raw)
		t.Logf("%s planned on an empty inbox, run over 31,000 rows: %d buffers", what, buffers)
		require.Less(t, buffers, 150, "the %s must touch O(rows claimed) pages whatever the statistics were when it was planned:\n%s", what, raw)
	}
	token := uuid.NewString()
	explain("claim", drv.queries.inboxClaim, fmt.Sprintf(`'g', 3, 'w', 60000, '%s', 10, 'x'`, token))
	// Expire the claims just made, for the rescue.
	_, err = pool.Exec(ctx, `UPDATE `+s+`.inbox SET state = 'processing', claim_expires_at = now() - interval '1 second' WHERE key = 'hot' AND seq = 1`)
	require.NoError(t, err)
	explain("rescue", drv.queries.inboxRescue, fmt.Sprintf(`'g', 1, 'w', 60000, '%s', 10, 'x'`, token))
	explain("completion", drv.queries.inboxFinish, fmt.Sprintf(`'g', '%s', '%s', 'processed', '', NULL, false`, head, token))
	explain("key refresh", drv.queries.inboxRefreshKeyNotify, fmt.Sprintf(`'g', '%s', 'processed', 'ch'`, hot))
	explain("batch completion", drv.batch.finish, fmt.Sprintf(`'g', '{%s}', '{%s}', '{processed}', '{""}', '{NULL}', '{false}'`, head, token))
	explain("batch key refresh", drv.batch.refreshKeys, fmt.Sprintf(`'g', '{%s,%s}'`, hot, head))
}

// TestInboxCostIsFlatInTheRowsInFlight: a claim and a batch's key refresh
// ask, for each key, whether another of its rows runs, and until when.
// That must be a lookup by key, not a read of the key's backlog nor of
// every row the group has in flight (8 workers with batches of 32 keep 256
// in flight; here 3,000): 32 keys with 39 rows behind each head and 3,000
// rows in flight cost the same as 32 keys with one row behind each and
// none, under the generic plans that pgx drivers run.
func TestInboxCostIsFlatInTheRowsInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	pool := pgtest.Pool(t)
	for _, g := range []struct {
		group string
		rows  int
	}{{"g", 1280}, {"h", 64}} {
		_, err := pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at)
			SELECT $1, gen_random_uuid(), 'k' || (i % 32), i, 't', 'T', '\x7b7d', now() FROM generate_series(1, $2::int) i`, g.group, g.rows)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key, runnable_at) SELECT $1, 'k' || i, now() FROM generate_series(0, 31) i`, g.group)
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, claim_expires_at, claim_token)
		SELECT 'g', gen_random_uuid(), 'busy' || i, 1, 't', 'T', '\x7b7d', now(), 'processing', now() + interval '1 hour', gen_random_uuid() FROM generate_series(1, 3000) i`)
	require.NoError(t, err)
	for _, table := range []string{"inbox", "inbox_keys"} {
		_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table)
		require.NoError(t, err)
	}
	cost := func(group string) (claim, refresh int) {
		var ids []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(event_id::text) FROM (SELECT DISTINCT ON (key) event_id FROM `+s+`.inbox
			WHERE group_name = $1 AND key LIKE 'k%' ORDER BY key, pos) h`, group).Scan(&ids))
		_, claim = statementCost(t, pool, true, drv.queries.inboxClaim,
			group, 32, "w", time.Minute.Milliseconds(), uuid.NewString(), 10, ferrydriver.ReasonAttemptsExhausted)
		_, refresh = statementCost(t, pool, true, drv.batch.refreshKeys, group, ids)
		return claim, refresh
	}
	busyClaim, busyRefresh := cost("g")
	idleClaim, idleRefresh := cost("h")
	t.Logf("32 keys, 39 rows behind each head, 3,000 rows in flight: claim looks at %d rows, batch key refresh %d; one row behind each, none in flight: %d, %d",
		busyClaim, busyRefresh, idleClaim, idleRefresh)
	require.InDelta(t, idleClaim, busyClaim, 200, "the claim looks up each key's rows in flight")
	require.InDelta(t, idleRefresh, busyRefresh, 200, "the refresh looks up each key's rows in flight")
}

// TestConsolePagesAreFlat: the admin API's lists (ferryui) read O(page),
// whatever the table holds: a page of relay dead letters, first or deep
// (after a cursor), of 100,000, and a page of a group's DEAD events of
// 100,000. Buffers are counted under the planner's plan for the page's
// values, and for dead letters under a generic plan too.
func TestConsolePagesAreFlat(t *testing.T) {
	t.Parallel()
	n := 100_000
	if testing.Short() {
		n = 30_000
	}
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	pool := pgtest.Pool(t)
	// A relay batch dead-letters together: 500 rows share each failure time.
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.dead_letters (feed, event_id, topic, key, seq, type, source, content_type, payload, created_at, reason, failed_at)
		SELECT 'default/' || (i % 4), gen_random_uuid(), 'orders', 'k' || i, 1, 'T', 'ferry', '', '\x7b7d', now(), 'refused',
		       now() - (i / 500) * interval '1 second' FROM generate_series(1, $1::int) i`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, finished_at, last_error)
		SELECT 'g', gen_random_uuid(), 'k' || i, 1, 't', 'T', '\x7b7d', now(), 'dead', now() - i * interval '1 millisecond', 'boom'
		  FROM generate_series(1, $1::int) i`, n)
	require.NoError(t, err)
	for _, table := range []string{"dead_letters", "inbox"} {
		_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table)
		require.NoError(t, err)
	}
	var deepAt time.Time
	var deepID string
	require.NoError(t, pool.QueryRow(ctx, `SELECT failed_at, event_id::text FROM `+s+`.dead_letters ORDER BY failed_at DESC, event_id OFFSET $1 LIMIT 1`, n*3/4).Scan(&deepAt, &deepID))
	for _, tc := range []struct {
		what    string
		q       string
		generic bool // also under a generic plan
		args    []any
	}{
		{"first page of dead letters", drv.queries.listDeadLetters, true, []any{"", "", "", "", nil, nil, 50, []string{}, "infinity", uuid.Nil.String()}},
		{"a deep page of dead letters", drv.queries.listDeadLetters, true, []any{"", "", "", "", nil, nil, 50, []string{}, deepAt.Format(time.RFC3339Nano), deepID}},
		{"a page of one feed's dead letters", drv.queries.listDeadLetters, true, []any{"default/1", "", "", "", nil, nil, 50, []string{}, "infinity", uuid.Nil.String()}},
		// The console's key page (migration 010); a filter by key is a
		// constant in its custom plan, which PostgreSQL keeps.
		{"a key's dead letters", drv.queries.listDeadLetters, false, []any{"", "k777", "", "", nil, nil, 50, []string{}, "infinity", uuid.Nil.String()}},
		// Its generic plan sorts the group's DEAD rows (about 2,000 pages
		// here): PostgreSQL keeps the custom plan, far cheaper, for it.
		{"a page of a group's DEAD events", strings.Replace(drv.queries.inboxList, "{states}", "'dead'", 1), false, []any{"g", []string{"dead"}, "", "", []string{}, nil, nil, 50}},
	} {
		custom := statementBuffers(t, pool, false, tc.q, tc.args...)
		t.Logf("%s, of %d: %d buffers", tc.what, n, custom)
		require.Less(t, custom, 300, "%s reads O(page)", tc.what)
		if tc.generic {
			generic := statementBuffers(t, pool, true, tc.q, tc.args...)
			t.Logf("%s, of %d, under a generic plan: %d buffers", tc.what, n, generic)
			require.Less(t, generic, 300, "%s reads O(page) under a generic plan", tc.what)
		}
	}
}
