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
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
)

// hotInbox fills group with a key "hot" of n rows and 31 keys of 2 rows
// each, straight into the tables, and returns nothing: the keys' rows say
// where their queues stand (migration 011).
func hotInbox(t *testing.T, pool *pgxpool.Pool, s, group string, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at)
		SELECT $1, gen_random_uuid(), CASE WHEN i <= $2 THEN 'hot' ELSE 'k' || (i % 31) END, i, 't', 'T', '\x7b7d', now()
		  FROM generate_series(1, $2::int + 62) i`, group, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key, runnable_at, done_pos, tail_pos)
		SELECT $1, key, now(), min(pos) - 1, max(pos) FROM `+s+`.inbox WHERE group_name = $1 GROUP BY key
		ON CONFLICT (group_name, key) DO NOTHING`, group)
	require.NoError(t, err)
}

// claimArgs are sqlInboxClaim's arguments: up to keys keys, perKey rows
// each, limit in all.
func claimArgs(group string, keys, perKey, limit int) []any {
	return []any{group, keys, "w", time.Minute.Milliseconds(), uuid.NewString(), 10, ferrydriver.ReasonAttemptsExhausted, perKey, limit}
}

// finishArgs are sqlInboxFinishRows's arguments for ids processed under
// claim.
func finishArgs(group, claim string, ids []string) []any {
	n := len(ids)
	claims, states, errs, retry, uncounted := make([]string, n), make([]string, n), make([]string, n), make([]*time.Time, n), make([]bool, n)
	for i := range ids {
		claims[i], states[i] = claim, "processed"
	}
	return []any{group, ids, claims, states, errs, retry, uncounted, false}
}

// claimFor claims like a consumer (through the driver, committed) and
// returns the claim's token and the claimed event IDs.
func claimFor(t *testing.T, drv *Driver[pgx.Tx], group string, keys, perKey, limit int) (string, []string) {
	t.Helper()
	rows, err := drv.ClaimInbox(context.Background(), &ferrydriver.ClaimInboxParams{Group: group, Worker: "w", Limit: limit, PerKey: perKey, Keys: keys,
		TTL: time.Minute, MaxAttempts: 10})
	require.NoError(t, err)
	require.NotEmpty(t, rows)
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.Event.ID.String()
	}
	return rows[0].Claim, ids
}

// TestInboxClaimIsFlatInAKeysBacklog: claiming a run of a hot key's rows,
// and finishing them, must cost the same with 100,000 rows behind them as
// with 1,000, under the generic plans a pgx driver runs and under the
// planner's own: a key's queue is read from its done_pos, by the partial
// index of unfinished rows. Buffers are compared, not times.
func TestInboxClaimIsFlatInAKeysBacklog(t *testing.T) {
	t.Parallel()
	n := 100_000
	if testing.Short() {
		n = 30_000
	}
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	pool := ferrypgtest.Pool(t)
	hotInbox(t, pool, s, "g", n)
	hotInbox(t, pool, s, "h", 1000)
	for _, table := range []string{"inbox", "inbox_keys"} {
		_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table)
		require.NoError(t, err)
	}
	// cost explains, in transactions rolled back after, a claim of every
	// key's run (up to 32 rows each) and the finish of the hot key's run
	// claimed beforehand: the larger buffer count of the two plans.
	cost := func(group string) (claim, finish int) {
		_, err := pool.Exec(ctx, `UPDATE `+s+`.inbox_keys SET runnable_at = now() - interval '1 hour' WHERE group_name = $1 AND key = 'hot'`, group)
		require.NoError(t, err)
		token, ids := claimFor(t, drv, group, 1, 32, 32)
		require.Len(t, ids, 32)
		for _, generic := range []bool{false, true} {
			c := statementBuffers(t, pool, generic, drv.queries.inboxClaim, claimArgs(group, 32, 32, 1024)...)
			f := statementBuffers(t, pool, generic, drv.queries.inboxFinishRows, finishArgs(group, token, ids)...)
			claim, finish = max(claim, c), max(finish, f)
		}
		return claim, finish
	}
	bigClaim, bigFinish := cost("g")

	// The gauges' counts are capped, and cost O(cap).
	counts, err := drv.InboxCounts(ctx, "g")
	require.NoError(t, err)
	require.Equal(t, int64(ferrydriver.InboxCountCap), counts[ferrydriver.InboxPending])
	// Each count reads the index up to the cap. Where VACUUM could not
	// mark the pages all-visible (another test's transaction was open),
	// each row counted costs a visit of its heap page too: about a buffer
	// a row, up to the cap. A read of the backlog would look at every row.
	countBuf, countRows := statementCost(t, pool, false, drv.queries.inboxCounts, "g", ferrydriver.InboxCountCap)
	t.Logf("counting the gauges over %d pending rows: %d buffers, %d rows looked at", n, countBuf, countRows)
	require.Less(t, countBuf, ferrydriver.InboxCountCap+1000, "counting reads the states index up to the cap, not the backlog")
	require.Less(t, countRows, 4*ferrydriver.InboxCountCap, "counting looks at the rows up to the cap (each twice: the scan, its limit), not the backlog")

	smallClaim, smallFinish := cost("h")
	t.Logf("a hot key with %d rows in its queue: claim %d buffers, finish of a run of 32 %d; with 1,000: claim %d, finish %d",
		n, bigClaim, bigFinish, smallClaim, smallFinish)
	require.Less(t, bigClaim, 800, "a claim touches O(rows claimed) pages (its 32 keys' writes included)")
	require.Less(t, bigFinish, 800, "a finish touches O(rows finished) pages")
	// The claim writes its keys (index entries, pages split or not): its
	// count varies by tens of buffers either way, and only a backlog that
	// costs more would be a fault.
	require.Less(t, bigClaim, smallClaim+60, "a claim costs no more behind a backlog")
	require.InDelta(t, smallFinish, bigFinish, 60)
}

// oneSessionDriver is a migrated driver on a pool of one session, closed
// when the test ends.
func oneSessionDriver(t *testing.T) (*Driver[pgx.Tx], *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(ferrypgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	drv, err := New(pool, &Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv, pool
}

// TestInboxPlansOnAnEmptyInbox: a pgx driver runs the inbox's statements
// under generic plans, cached per session and kept until the tables'
// statistics change. Planned on an inbox whose statistics say it is empty
// (a new deployment), they must still touch O(rows) pages once a hot key
// has 30,000 rows in its queue and the statistics are stale (a scan of
// the inbox would read some 600 pages).
func TestInboxPlansOnAnEmptyInbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, pool := oneSessionDriver(t) // the statements' plans are cached on it
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	for _, table := range []string{"inbox", "inbox_keys"} {
		// The statistics stay those of the empty tables: an autovacuum's
		// analyze during the test would have the explains below replan.
		_, err := pool.Exec(ctx, `ALTER TABLE `+s+`.`+table+` SET (autovacuum_enabled = false)`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table)
		require.NoError(t, err)
	}
	// Plan every statement of a claim, a finish and a refresh on the empty
	// inbox (a prepared statement's generic plan is made at its first run).
	for i := range 6 {
		ev := ferrydrivertest.Event("t", fmt.Sprintf("warm%d", i), "T")
		_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{ev}})
		require.NoError(t, err)
		rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 1, TTL: time.Minute, MaxAttempts: 10})
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if i%3 == 0 {
				return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: ev.ID, Claim: rows[0].Claim})
			}
			// A row processed (the statement of runs that all processed),
			// or failed and then processed (the general one).
			state := ferrydriver.InboxProcessed
			if i%3 == 2 {
				state = ferrydriver.InboxDead
			}
			lost, err := drv.FinishInboxTx(ctx, tx, &ferrydriver.FinishInboxParams{Group: "g",
				Rows: []ferrydriver.FinishedRow{{EventID: ev.ID, Claim: rows[0].Claim, State: state, Error: "x"}}})
			require.Empty(t, lost)
			return err
		}))
		require.NoError(t, drv.inTx(ctx, func(e executor) error { return drv.refreshKeys(ctx, e, "g", []string{"warm0"}) }))
	}
	// And a rescue's: a claim that expires, rescued, whose rescue's claim
	// expires too and is found lost at its commit.
	ev := ferrydrivertest.Event("t", "warm-rescue", "T")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{ev}})
	require.NoError(t, err)
	for _, rescue := range []bool{false, true} {
		require.Eventually(t, func() bool {
			rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 1, TTL: time.Millisecond, MaxAttempts: 10, Rescue: rescue})
			require.NoError(t, err)
			return len(rows) == 1
		}, 30*time.Second, 5*time.Millisecond)
		require.Eventually(t, func() bool { due, err := drv.RescueDue(ctx, "g"); return err == nil && due }, 30*time.Second, 5*time.Millisecond)
	}
	var lost *ferrydriver.ClaimsLostError
	require.ErrorAs(t, drv.RunInTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: ev.ID, Claim: uuid.NewString()})
	}), &lost)
	hotInbox(t, pool, s, "g", 30_000)
	token, ids := claimFor(t, drv, "g", 1, 32, 32) // the hot key, runnable first
	tokens := make([]string, len(ids))
	for i := range tokens {
		tokens[i] = token
	}

	explain := func(what string, limit int, query string, args ...any) {
		t.Helper()
		raw, text := explainGeneric(t, pool, query, args...)
		buffers, _ := planBuffers(t, raw)
		t.Logf("%s planned on an empty inbox, run over 30,000 rows: %d buffers", what, buffers)
		require.Less(t, buffers, limit, "the %s must touch O(rows) pages whatever the statistics were when it was planned:\n%s", what, text)
	}
	// Bounds: a run of 32 rows claimed, finished or charged (their rows,
	// index entries and keys), one row completed, three keys recomputed, a
	// rescue's key and head; a scan of the hot key's 30,000 rows reads
	// thousands. (The claim's count includes its 31 keys' writes: its last
	// part reads what they wrote.)
	explain("claim", 600, drv.queries.inboxClaim, claimArgs("g", 32, 32, 256)...)
	explain("finish", 800, drv.queries.inboxFinishRows, finishArgs("g", token, ids)...)
	explain("completion of one", 60, drv.queries.inboxCompleteOne, "g", ids[0], token, true)
	explain("completion of a run", 800, drv.queries.inboxCompleteRows, "g", ids, token, false)
	explain("key refresh", 60, drv.queries.inboxRefreshKeys, "g", []string{"hot", "k1", "k2"})
	explain("rescue check", 60, drv.queries.inboxRescueDue, "g")
	explain("rescue's keys", 60, drv.queries.inboxRescueKeys, "g", 1)
	explain("rescue's charge", 800, drv.queries.inboxCharge, "g", "hot", 0, 32)
	explain("rescue's head", 60, drv.queries.inboxHead, "g", "hot", 0)
	explain("lost claims", 400, drv.queries.inboxLostClaims, "g", ids, tokens)

	// A group that has seen 30,000 keys: a completion of one event reads
	// its key's row only, and so do a finish of one key's rows and a
	// refresh of one key (a finish or a refresh of several keys reads the
	// group's keys between them under these plans: issue 36's notes).
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key, done_pos, tail_pos)
		SELECT 'g', 'done' || i, 1, 1 FROM generate_series(1, 30000) i`)
	require.NoError(t, err)
	explain("completion of one, 30,000 keys in the group", 60, drv.queries.inboxCompleteOne, "g", ids[1], token, true)
	explain("key refresh of one key, 30,000 keys in the group", 60, drv.queries.inboxRefreshKeys, "g", []string{"hot"})
	// A claim of three of the group's runnable keys (hotInbox's k0..k30)
	// gives each its claim through the row it locked, and spends nothing.
	raw, text := explainGeneric(t, pool, drv.queries.inboxClaim, claimArgs("g", 3, 32, 96)...)
	claimedKeys, spentKeys := keysLookedAt(t, raw, "CTE claimed"), keysLookedAt(t, raw, "CTE spent_keys")
	t.Logf("claim of three keys with 30,000 keys in the group: giving them their claim looked at %d keys, the spent rows' keys %d", claimedKeys, spentKeys)
	require.Equal(t, 3, claimedKeys, "the claim updates the keys it locked, not a scan of the group's:\n%s", text)
	require.Zero(t, spentKeys, "a claim that spent no row reads no key for it:\n%s", text)
	for _, st := range []struct {
		what  string
		query string
		args  []any
	}{
		{"finish", drv.queries.inboxFinishRows, finishArgs("g", token, ids[2:])},
		{"completion of a run", drv.queries.inboxCompleteRows, []any{"g", ids[2:], token, false}},
	} {
		raw, text := explainGeneric(t, pool, st.query, st.args...)
		locked, held := keysLookedAt(t, raw, "CTE locked"), keysLookedAt(t, raw, "CTE held")
		t.Logf("%s of one key's rows with 30,000 keys in the group: locking its key looked at %d keys, moving it %d", st.what, locked, held)
		require.Equal(t, 1, locked, "the %s locks its keys by their primary key, not by a scan of the group's:\n%s", st.what, text)
		require.Equal(t, 1, held, "the %s of one key's rows moves that key's row, not a scan of the group's:\n%s", st.what, text)
	}
	// A finish of two keys' rows, the group's 30,000 keys between them:
	// planned on the empty group it reads the keys between them (issue
	// 36's notes); once the group's statistics are those of its keys (an
	// analyze, autovacuum's within a minute), the plan is remade and
	// reaches each key's row alone.
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at)
		SELECT 'g', gen_random_uuid(), k, 1, 't', 'T', '\x7b7d', now() FROM unnest(ARRAY['a', 'z']) k`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key, runnable_at, done_pos, tail_pos)
		SELECT 'g', key, now() - interval '1 hour', pos - 1, pos FROM `+s+`.inbox WHERE group_name = 'g' AND key IN ('a', 'z')`)
	require.NoError(t, err)
	token, ids = claimFor(t, drv, "g", 2, 1, 2)
	require.Len(t, ids, 2)
	raw, _ = explainGeneric(t, pool, drv.queries.inboxFinishRows, finishArgs("g", token, ids)...)
	t.Logf("finish of two keys' rows with 30,000 keys between them, planned on the empty group: moving them looked at %d keys", keysLookedAt(t, raw, "CTE held"))
	_, err = pool.Exec(ctx, `ANALYZE `+s+`.inbox_keys`)
	require.NoError(t, err)
	for _, st := range []struct {
		what  string
		query string
		args  []any
	}{
		{"finish", drv.queries.inboxFinishRows, finishArgs("g", token, ids)},
		{"completion of a run", drv.queries.inboxCompleteRows, []any{"g", ids, token, false}},
	} {
		raw, text := explainGeneric(t, pool, st.query, st.args...)
		locked, held := keysLookedAt(t, raw, "CTE locked"), keysLookedAt(t, raw, "CTE held")
		t.Logf("%s of two keys' rows with 30,000 keys between them: locking looked at %d keys, moving them %d", st.what, locked, held)
		require.Equal(t, 2, locked, "the %s locks its keys by their primary key:\n%s", st.what, text)
		require.Equal(t, 2, held, "the %s of two keys' rows moves those keys' rows, not the keys between them:\n%s", st.what, text)
	}
}

// explainGeneric runs EXPLAIN ANALYZE of the generic plan that the session
// of pool prepared for query, in a transaction rolled back after: the plan
// in JSON (with buffers), and in text for a failure's message.
func explainGeneric(t *testing.T, pool *pgxpool.Pool, query string, args ...any) (raw []byte, text string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var name string
	require.NoError(t, conn.QueryRow(ctx, `SELECT name FROM pg_prepared_statements WHERE statement = $1`, query).Scan(&name),
		"the statement is prepared on the session:\n%s", query)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// The driver's planner settings (plannerSettings): when the cached
	// plan was invalidated meanwhile (an invalidation queue overflowing
	// while parallel tests run DDL resets every cached plan), EXECUTE
	// plans again, and must plan as the driver would.
	for _, set := range plannerSettings {
		_, err = tx.Exec(ctx, "SELECT set_config($1, $2, true)", set[0], set[1])
		require.NoError(t, err)
	}
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE `+pgx.Identifier{name}.Sanitize()+`(`+explainArgs(args)+`)`).Scan(&raw))
	return raw, textPlan(t, tx, name, args)
}

// keysLookedAt is how many rows of inbox_keys the scans under the plan node
// named name (its "Subplan Name", such as "CTE locked") looked at: those
// they returned and those their filters removed, per loop. (Buffers would
// count the subqueries those scans' conditions ran too.)
func keysLookedAt(t *testing.T, raw []byte, name string) int {
	t.Helper()
	var plan []struct{ Plan map[string]any }
	require.NoError(t, json.Unmarshal(raw, &plan))
	found := false
	var walk func(n map[string]any, in bool) int
	walk = func(n map[string]any, in bool) int {
		in = in || n["Subplan Name"] == name
		found = found || in
		rows := 0
		if in && n["Relation Name"] == "inbox_keys" && strings.Contains(fmt.Sprint(n["Node Type"]), "Scan") {
			got, _ := n["Actual Rows"].(float64)
			removed, _ := n["Rows Removed by Filter"].(float64)
			loops, _ := n["Actual Loops"].(float64)
			rows += int((got + removed) * max(loops, 1))
		}
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			if m, ok := c.(map[string]any); ok {
				rows += walk(m, in)
			}
		}
		return rows
	}
	rows := walk(plan[0].Plan, false)
	require.True(t, found, "the plan has no node %q:\n%s", name, raw)
	return rows
}

// explainArgs writes args as SQL literals, for EXECUTE (which takes no
// parameters of its own).
func explainArgs(args []any) string {
	values := make([]string, len(args))
	for i, a := range args {
		v := fmt.Sprint(a)
		switch a := a.(type) {
		case nil:
			values[i] = "NULL"
			continue
		case []string:
			parts := make([]string, len(a))
			for j, e := range a {
				parts[j] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(e) + `"`
			}
			v = "{" + strings.Join(parts, ",") + "}"
		case []bool:
			parts := make([]string, len(a))
			for j, b := range a {
				parts[j] = fmt.Sprint(b)
			}
			v = "{" + strings.Join(parts, ",") + "}"
		case []*time.Time:
			parts := make([]string, len(a))
			for j, tm := range a {
				parts[j] = "NULL"
				if tm != nil {
					parts[j] = tm.Format(time.RFC3339Nano)
				}
			}
			v = "{" + strings.Join(parts, ",") + "}"
		case time.Time:
			v = a.Format(time.RFC3339Nano)
		}
		values[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
	}
	return strings.Join(values, ", ")
}

// TestInboxCostIsFlatInTheKeysInFlight: a claim and a finish must cost the
// same whether thousands of the group's other keys are claimed or not (8
// workers with batches of 32 keep 256 claimed; here 3,000): they read the
// keys they take, not the group's claims.
func TestInboxCostIsFlatInTheKeysInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	pool := ferrypgtest.Pool(t)
	for _, g := range []string{"g", "h"} {
		hotInbox(t, pool, s, g, 64)
	}
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key, claim_token, claim_from, claim_through, claim_expires_at, rescue_at)
		SELECT 'g', 'busy' || i, gen_random_uuid(), 0, 1, now() + interval '1 hour', now() + interval '1 hour' FROM generate_series(1, 3000) i`)
	require.NoError(t, err)
	for _, table := range []string{"inbox", "inbox_keys"} {
		_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table)
		require.NoError(t, err)
	}
	cost := func(group string) (claim, finish int) {
		_, claim = statementCost(t, pool, true, drv.queries.inboxClaim, claimArgs(group, 32, 1, 32)...)
		token, ids := claimFor(t, drv, group, 32, 1, 32)
		_, finish = statementCost(t, pool, true, drv.queries.inboxFinishRows, finishArgs(group, token, ids)...)
		return claim, finish
	}
	busyClaim, busyFinish := cost("g")
	idleClaim, idleFinish := cost("h")
	t.Logf("32 keys with 3,000 others claimed: the claim looks at %d rows, the finish of 32 rows %d; with none claimed: %d, %d",
		busyClaim, busyFinish, idleClaim, idleFinish)
	require.InDelta(t, idleClaim, busyClaim, 100, "the claim reads the keys it takes")
	require.InDelta(t, idleFinish, busyFinish, 100, "the finish reads the keys it moves")
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
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE "+name+"("+explainArgs(args)+")").Scan(&raw))
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
	ferrypgtest.Pool(t)
	cfg, err := pgxpool.ParseConfig(ferrypgtest.URL())
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
	pool := ferrypgtest.Pool(t)
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

// TestPoolPipelinesLeaveTheSessionsSettings: a pipeline on a pool sends
// no step to put the planner settings back: the batch is an implicit
// transaction, and the settings are local to it. The pool's one session
// must have its defaults after a claim.
func TestPoolPipelinesLeaveTheSessionsSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, pool := oneSessionDriver(t)
	ev := ferrydrivertest.Event("t", "k", "T")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{ev}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 1, TTL: time.Minute, MaxAttempts: 10})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	var mode string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('plan_cache_mode') || ' ' || current_setting('enable_seqscan') || ' ' || current_setting('enable_bitmapscan')`).Scan(&mode))
	require.Equal(t, "auto on on", mode, "plan_cache_mode, enable_seqscan, enable_bitmapscan")
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
	pool := ferrypgtest.Pool(t)
	// A relay batch dead-letters together: 500 rows share each failure time.
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.dead_letters (feed, event_id, topic, key, seq, type, source, content_type, payload, created_at, reason, failed_at)
		SELECT 'default/' || (i % 4), gen_random_uuid(), 'orders', 'k' || i, 1, 'T', 'ferry', '', '\x7b7d', now(), 'refused',
		       now() - (i / 500) * interval '1 second' FROM generate_series(1, $1::int) i`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, finished_at, last_error)
		SELECT 'g', gen_random_uuid(), 'k' || i, 1, 't', 'T', '\x7b7d', now(), 'dead', now() - i * interval '1 millisecond', 'boom'
		  FROM generate_series(1, $1::int) i`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key, runnable_at) SELECT 'g' || (i % 3), 'k' || i, NULL FROM generate_series(1, $1::int) i`, n)
	require.NoError(t, err)
	// A backlog of as many PENDING events (a tenth of them FAILED, waiting
	// for their retry), and as many PROCESSED ones.
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, attempts, next_attempt_at, last_error)
		SELECT 'g', gen_random_uuid(), 'p' || (i % 5000), i, 't', 'T', '\x7b7d', now(), CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'pending' END,
		       CASE WHEN i % 10 = 0 THEN 1 ELSE 0 END, now() + interval '1 hour', CASE WHEN i % 10 = 0 THEN 'boom' END
		  FROM generate_series(1, $1::int) i`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, attempts, finished_at)
		SELECT 'g', gen_random_uuid(), 'd' || i, 1, 't', 'T', '\x7b7d', now(), 'processed', 1, now() - i * interval '1 millisecond'
		  FROM generate_series(1, $1::int) i`, n)
	require.NoError(t, err)
	for _, table := range []string{"dead_letters", "inbox", "inbox_keys"} {
		_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table)
		require.NoError(t, err)
	}
	var deepAt time.Time
	var deepID string
	require.NoError(t, pool.QueryRow(ctx, `SELECT failed_at, event_id::text FROM `+s+`.dead_letters ORDER BY failed_at DESC, event_id OFFSET $1 LIMIT 1`, n*3/4).Scan(&deepAt, &deepID))
	var deepFin, deepRec time.Time
	var deepEvent uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT finished_at, received_at, event_id FROM `+s+`.inbox WHERE group_name = 'g' AND state = 'dead'
		ORDER BY finished_at DESC, received_at DESC, event_id DESC OFFSET $1 LIMIT 1`, n*3/4).Scan(&deepFin, &deepRec, &deepEvent))
	deadList, err := drv.listQuery([]string{"dead"})
	require.NoError(t, err)
	allStates := make([]string, len(ferrydriver.InboxStates))
	for i, st := range ferrydriver.InboxStates {
		allStates[i] = string(st)
	}
	timeline, err := drv.listQuery(allStates)
	require.NoError(t, err)
	pendingList, err := drv.listQuery([]string{"pending"})
	require.NoError(t, err)
	failedList, err := drv.listQuery([]string{"failed"})
	require.NoError(t, err)
	processedList, err := drv.listQuery([]string{"processed"})
	require.NoError(t, err)
	discardedList, err := drv.listQuery([]string{"discarded"})
	require.NoError(t, err)
	blockingList, err := drv.listQuery([]string{"failed", "dead"})
	require.NoError(t, err)
	for _, tc := range []struct {
		what    string
		q       string
		generic bool // also under a generic plan
		args    []any
	}{
		{"first page of dead letters", drv.queries.listDeadLetters.exact, true, []any{"", "", "", "", nil, nil, []string{}, "", 50, "infinity", uuid.Nil.String()}},
		{"a deep page of dead letters", drv.queries.listDeadLetters.exact, true, []any{"", "", "", "", nil, nil, []string{}, "", 50, deepAt.Format(time.RFC3339Nano), deepID}},
		{"a page of one feed's dead letters", drv.queries.listDeadLetters.exact, true, []any{"default/1", "", "", "", nil, nil, []string{}, "", 50, "infinity", uuid.Nil.String()}},
		// The console's key page (migration 010); a filter by key is a
		// constant in its custom plan, which PostgreSQL keeps.
		// Every feed with dead letters (4, over 100,000 of them): a skip
		// along the primary key, a probe per feed.
		{"the feeds", drv.queries.listFeeds, false, nil},
		{"a key's dead letters", drv.queries.listDeadLetters.exact, false, []any{"", "k777", "", "", nil, nil, []string{}, "", 50, "infinity", uuid.Nil.String()}},
		// Its generic plan sorts the group's DEAD rows (about 2,000 pages
		// here): PostgreSQL keeps the custom plan, far cheaper, for it.
		{"a page of a group's DEAD events", deadList, false, []any{"g", []string{"dead"}, "", "", []string{}, nil, nil, 50, nil, nil, nil}},
		// The console's next page: a range of inbox_dead_idx from the cursor.
		{"a deep page of a group's DEAD events", deadList, false, []any{"g", []string{"dead"}, "", "", []string{}, nil, nil, 50, deepFin, deepRec, deepEvent}},
		{"the console's page of 500 DEAD events", deadList, false, []any{"g", []string{"dead"}, "", "", []string{}, nil, nil, 500, nil, nil, nil}},
		// The event's timeline: its row in the group, in any state.
		// The groups, found by skipping along inbox_keys from one to the next.
		{"the consumer groups (3, over 100,000 keys)", drv.queries.inboxGroups, true, []any{1000}},
		{"an event's row, in any state", timeline, false, []any{"g", allStates, "", "", []string{deepEvent.String()}, nil, nil, 1, nil, nil, nil}},
		// A group's backlog, a page at a time (migration 016): newest
		// received first, whatever its size. Each row listed costs about 3
		// buffers more (its key's claim, looked up), so a page of 500 reads
		// about 1,500: these pages are of 50.
		{"a page of a group's PENDING events", pendingList, false, []any{"g", []string{"pending"}, "", "", []string{}, nil, nil, 50, nil, nil, nil}},
		{"a page of a group's FAILED events", failedList, false, []any{"g", []string{"failed"}, "", "", []string{}, nil, nil, 50, nil, nil, nil}},
		{"a page of a group's PROCESSED events", processedList, false, []any{"g", []string{"processed"}, "", "", []string{}, nil, nil, 500, nil, nil, nil}},
		// A key's rows that hold it, and its waiting ones (the console's
		// key page): the key's unfinished rows, by inbox_unfinished_idx.
		{"a key's DEAD and FAILED rows", blockingList, false, []any{"g", []string{"failed", "dead"}, "k777", "", []string{}, nil, nil, 50, nil, nil, nil}},
		{"a key's PENDING rows", pendingList, false, []any{"g", []string{"pending"}, "p77", "", []string{}, nil, nil, 51, nil, nil, nil}},
		// No DISCARDED row: an index's empty range, not a walk of the group.
		{"a page of a group's DISCARDED events", discardedList, false, []any{"g", []string{"discarded"}, "", "", []string{}, nil, nil, 500, nil, nil, nil}},
		{"the group's counts by state, each up to 100", drv.queries.inboxCounts, true, []any{"g", 100}},
		// Its history in the group (migration 014).
		{"an event's history", drv.queries.inboxAttempts, true, []any{"g", deepEvent.String()}},
	} {
		custom := statementBuffers(t, pool, false, tc.q, tc.args...)
		t.Logf("%s, of %d: %d buffers", tc.what, n, custom)

		require.Less(t, custom, 300, "%s reads O(page)", tc.what)
		// The planner's cost decides JIT compilation, which took 0.8 s of
		// a 1 ms page when a filter made it cost a walk of every row.
		require.False(t, jitCompiled(t, pool, tc.q, tc.args...), "%s: planned as costly enough to JIT-compile", tc.what)
		if tc.generic {
			generic := statementBuffers(t, pool, true, tc.q, tc.args...)
			t.Logf("%s, of %d, under a generic plan: %d buffers", tc.what, n, generic)
			require.Less(t, generic, 300, "%s reads O(page) under a generic plan", tc.what)
		}
	}
}

// TestReasonsReadTheirScanOnly: a grouping by reason of the newest 1,000
// failures reads as much whatever the table holds (about a buffer a row:
// each row's heap tuple), and is not JIT-compiled.
func TestReasonsReadTheirScanOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := ferrypgtest.Pool(t)
	var read []int
	for _, n := range []int{10_000, 100_000} {
		drv := newTestDriver(t)
		s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
		_, err := pool.Exec(ctx, `INSERT INTO `+s+`.dead_letters (feed, event_id, topic, key, seq, type, source, content_type, payload, created_at, reason, failed_at)
			SELECT 'default/' || (i % 4), gen_random_uuid(), 'orders', 'k' || i, 1, 'T', 'ferry', '', '\x7b7d', now(), 'refused: ' || (i % 7),
			       now() - (i / 500) * interval '1 second' FROM generate_series(1, $1::int) i`, n)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, finished_at, last_error)
			SELECT 'g', gen_random_uuid(), 'k' || i, 1, 't', 'T', '\x7b7d', now(), 'dead', now() - i * interval '1 millisecond', 'boom ' || (i % 5)
			  FROM generate_series(1, $1::int) i`, n)
		require.NoError(t, err)
		for _, table := range []string{"dead_letters", "inbox"} {
			_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.`+table)
			require.NoError(t, err)
		}
		for _, tc := range []struct {
			what string
			q    string
			args []any
		}{
			{"dead letters", drv.queries.deadLetterReasons.exact, []any{"", 1000, 500, 100}},
			{"one feed's dead letters", drv.queries.deadLetterReasons.exact, []any{"default/1", 1000, 500, 100}},
			{"a group's dead events", drv.queries.inboxDeadReasons, []any{"g", 1000, 500, 100}},
		} {
			buf := statementBuffers(t, pool, false, tc.q, tc.args...)
			t.Logf("%s by reason, newest 1,000 of %d: %d buffers", tc.what, n, buf)
			require.Less(t, buf, 1500, "%s: the scan's rows, not the table's", tc.what)
			require.False(t, jitCompiled(t, pool, tc.q, tc.args...), "%s: planned as costly enough to JIT-compile", tc.what)
			read = append(read, buf)
		}
	}
	for i := range 3 {
		require.InDelta(t, read[i], read[i+3], float64(read[i])/5+10, "as much read at 10,000 rows as at 100,000: %v", read)
	}
}

// jitCompiled says whether PostgreSQL, with JIT on (its default), would
// JIT-compile the statement: its plan's cost passed jit_above_cost.
func jitCompiled(t *testing.T, pool *pgxpool.Pool, q string, args ...any) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL jit = on")
	require.NoError(t, err)
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q, args...).Scan(&raw))
	return strings.Contains(string(raw), `"JIT"`)
}

// textPlan is the EXPLAIN ANALYZE of the prepared statement name in text,
// for a failure's message.
func textPlan(t *testing.T, tx pgx.Tx, name string, args []any) string {
	t.Helper()
	rows, err := tx.Query(context.Background(), `EXPLAIN (ANALYZE, BUFFERS) EXECUTE `+pgx.Identifier{name}.Sanitize()+`(`+explainArgs(args)+`)`)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// TestAwaitSettledSeesAFinishItWaitedFor: a finisher that updated the row
// before the waiter registered (so it notifies no one) and commits while
// AwaitSettled's first read waits for its lock is seen by that read: the
// row's new state, not the claim that the read's snapshot still shows
// (PostgreSQL re-reads the locked row, not the lateral subquery beside it).
// Before, the read reported PROCESSING and the call waited out its
// deadline.
func TestAwaitSettledSeesAFinishItWaitedFor(t *testing.T) {
	t.Parallel()
	drv := newTestDriver(t)
	pool := ferrypgtest.Pool(t)
	ctx := context.Background()
	ev := &ferryevent.Event{Topic: "t", Key: "k", Type: "E", Payload: []byte(`{}`)}
	require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
	ev.Seq = 1
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{ev}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, rows, 1)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: ev.ID, Claim: rows[0].Claim}))

	type answer struct {
		rows map[uuid.UUID]*ferrydriver.InboxRow
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		rows, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{ev.ID}, Deadline: time.Now().Add(5 * time.Minute)})
		done <- answer{rows, err}
	}()
	// Commit once the first read waits for the row's lock.
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%FOR SHARE OF i%' AND query LIKE '%'||$1||'%')`, drv.cfg.Schema).Scan(&waiting)
		return err == nil && waiting
	}, time.Minute, 10*time.Millisecond, "AwaitSettled's read never waited for the finisher's lock")
	require.NoError(t, tx.Commit(ctx))

	select {
	case a := <-done:
		require.NoError(t, a.err)
		require.Equal(t, ferrydriver.InboxProcessed, a.rows[ev.ID].State)
	case <-time.After(time.Minute):
		t.Fatal("AwaitSettled did not answer within a minute of the commit it waited for (its deadline is 5 minutes away)")
	}
}
