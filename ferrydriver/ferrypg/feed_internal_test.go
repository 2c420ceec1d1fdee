package ferrypg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func newTestDriver(t testing.TB) *Driver[pgx.Tx] {
	t.Helper()
	drv, err := New(ferrypgtest.Pool(t), &Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv
}

// fillBacklog inserts n committed events directly, as a bulk load would.
func fillBacklog(t testing.TB, drv *Driver[pgx.Tx], n int) {
	t.Helper()
	ctx := context.Background()
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	for done := 0; done < n; done += 250000 {
		k := min(250000, n-done)
		_, err := ferrypgtest.Pool(t).Exec(ctx, `INSERT INTO `+s+`.outbox (event_id, topic, key, seq, type, payload, created_at)
			SELECT gen_random_uuid(), 'orders', 'k' || (g % 500), $1 + g / 500 + 1, 'T', convert_to(repeat('x', 200), 'UTF8'), now()
			FROM generate_series(0, $2 - 1) g`, done/500, k)
		require.NoError(t, err)
	}
	// No ANALYZE: right after a bulk load the statistics are stale, and the
	// feed must not depend on them.
}

// explainBuffers runs the feed's batch query for st under EXPLAIN and
// returns the shared buffers it touched and its execution time.
func explainBuffers(t testing.TB, f *feed[pgx.Tx], st *feedState, limit int) (int, float64) {
	t.Helper()
	var raw []byte
	err := queryRow(context.Background(), f.sess.exec, []any{&raw}, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+f.d.queries.readBatch,
		0, max(st.After, st.Low), st.High, xidStrings(st.CurXip), limit, strconv.FormatUint(st.CurXmax, 10),
		st.stragglers(), st.After, st.Low)
	require.NoError(t, err)
	return planBuffers(t, raw)
}

// planBuffers reads the shared buffers a statement touched and its execution
// time (ms) from EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) output.
func planBuffers(t testing.TB, raw []byte) (int, float64) {
	t.Helper()
	var plan []struct {
		Plan struct {
			SharedHit  int `json:"Shared Hit Blocks"`
			SharedRead int `json:"Shared Read Blocks"`
		}
		ExecutionTime float64 `json:"Execution Time"`
	}
	require.NoError(t, json.Unmarshal(raw, &plan))
	return plan[0].Plan.SharedHit + plan[0].Plan.SharedRead, plan[0].ExecutionTime
}

// TestFeedBacklogQueryIsFlat: with a 1M-row backlog, a batch read costs the
// same at the start and at the end of the backlog. Buffers touched are
// compared (deterministic), not times; times are logged.
func TestFeedBacklogQueryIsFlat(t *testing.T) {
	t.Parallel()
	n := 1_000_000
	if testing.Short() {
		n = 200_000
	}
	drv := newTestDriver(t)
	fillBacklog(t, drv, n)
	ctx := context.Background()
	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "b/0"})
	require.NoError(t, err)
	defer f.Close()
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 500, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Events, 500)
	fd := f.(*feed[pgx.Tx])
	st := *fd.st
	require.EqualValues(t, n, st.High-st.Low, "one batch spans the whole backlog")

	startBuf, startMs := explainBuffers(t, fd, &st, 500)
	st.After = st.Low + int64(n) - 1000
	endBuf, endMs := explainBuffers(t, fd, &st, 500)
	t.Logf("batch of 500 over a %d-row backlog: start %d buffers %.2f ms, end %d buffers %.2f ms", n, startBuf, startMs, endBuf, endMs)
	// 500 rows of ~300 bytes fill about 20 heap pages, plus index pages.
	require.Less(t, startBuf, 200, "reading a batch must touch O(batch) pages")
	require.Less(t, endBuf, 200, "reading a batch must touch O(batch) pages")
	require.InDelta(t, startBuf, endBuf, float64(startBuf), "cost must not grow with the position in the backlog")

	// and so is the statement that opens a batch and reads its first rows
	var raw []byte
	require.NoError(t, queryRow(ctx, fd.sess.exec, []any{&raw}, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.tickRead,
		0, 500, st.Low, strconv.FormatUint(st.PrevXmax, 10), xidStrings(st.PrevXip)))
	tickBuf, _ := planBuffers(t, raw)
	t.Logf("opening a batch over the backlog: %d buffers", tickBuf)
	require.Less(t, tickBuf, 200)
}

// TestFeedPlansOnAnEmptyOutbox: the feed's statements are planned once per
// session (force_generic_plan), and a relay often starts on an empty outbox
// whose statistics say so. The plan made then must stay O(batch) once the
// outbox holds thousands of rows: max(id) was planned as a full scan of
// outbox_xid_idx and the late-transaction scan as a full scan of
// outbox_pkey, ~5,000 buffers per tick at 8,000 rows in the side-by-side
// bench. Buffers are compared, not times.
func TestFeedPlansOnAnEmptyOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	pool := ferrypgtest.Pool(t)
	_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.outbox`)
	require.NoError(t, err)
	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "plans/0"})
	require.NoError(t, err)
	defer f.Close()
	fd := f.(*feed[pgx.Tx])
	// Plan the tick, and the read of a batch's further rows, on an outbox
	// that is as good as empty.
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 500})
	require.NoError(t, err)
	require.Empty(t, b.Events)
	fillBacklog(t, drv, 3)
	for range 3 {
		b, err = f.Read(ctx, &ferrydriver.ReadParams{Max: 1})
		require.NoError(t, err)
		require.Len(t, b.Events, 1)
	}

	fillBacklog(t, drv, 20_000)
	// The newest transaction: the late scan looks at xids from here on.
	var xid string
	require.NoError(t, pool.QueryRow(ctx, `WITH i AS (INSERT INTO `+s+`.outbox (event_id, topic, key, seq, type, payload, created_at)
		SELECT gen_random_uuid(), 'orders', 'n' || g, 1, 'T', '\x00', now() FROM generate_series(1, 10) g RETURNING xid)
		SELECT min(xid)::text FROM i`).Scan(&xid))
	var high int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(id) FROM `+s+`.outbox`).Scan(&high))

	var xmax string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&xmax))
	explain := func(what, query, args string) {
		t.Helper()
		var name string
		require.NoError(t, queryRow(ctx, fd.sess.exec, []any{&name}, `SELECT name FROM pg_prepared_statements WHERE statement = $1`, query),
			"the %s statement is prepared on the feed's session", what)
		var raw []byte
		require.NoError(t, queryRow(ctx, fd.sess.exec, []any{&raw}, fmt.Sprintf(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE %s(%s)`,
			pgx.Identifier{name}.Sanitize(), args)))
		buffers, _ := planBuffers(t, raw)
		t.Logf("%s planned on an empty outbox, run over 20,013 rows: %d buffers", what, buffers)
		require.Less(t, buffers, 100, "the %s must touch O(batch) pages whatever the statistics were when it was planned:\n%s", what, raw)
	}
	explain("tick", drv.queries.tickRead, fmt.Sprintf(`0, 500, %d, '%s', '{}'`, high-5, xid))
	// The rest of a batch: 100 rows near the end, then one straggler.
	explain("batch read", drv.queries.readBatch, fmt.Sprintf(`0, %d, %d, '{}', 100, '%s', '{%s}', %d, %d`, high-200, high, xmax, xid, high-200, high-100))
}

func TestMigrateDownAndUp(t *testing.T) {
	t.Parallel()
	drv := newTestDriver(t)
	ctx := context.Background()
	res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	require.Empty(t, res.Applied, "a second up is a no-op")
	dry, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true, DryRun: true})
	require.NoError(t, err)
	require.Len(t, dry.Applied, 1)
	require.NoError(t, drv.Append(ctx, nil))
	res, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true})
	require.NoError(t, err)
	require.Equal(t, allMigrations[len(allMigrations)-2].Version, res.Current, "down reverts one migration by default")
	res, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true, Steps: 99})
	require.NoError(t, err)
	require.Equal(t, 0, res.Current)
	_, err = drv.LoadCheckpoint(ctx, "x")
	require.ErrorIs(t, err, ferrydriver.ErrSchemaMissing)
	require.Contains(t, err.Error(), "ferry migrate up")
	res, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	require.Equal(t, allMigrations[len(allMigrations)-1].Version, res.Current)
}

func TestInvalidRowsAreReported(t *testing.T) {
	t.Parallel()
	drv := newTestDriver(t)
	ctx := context.Background()
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	_, err := ferrypgtest.Pool(t).Exec(ctx, `INSERT INTO `+s+`.outbox (event_id, topic, key, seq, type, payload, created_at, headers) VALUES
		(gen_random_uuid(), '', 'k', 1, 'T', '', now(), NULL),
		(gen_random_uuid(), 't', 'k', 2, 'T', '', now(), '[1,2]'),
		(gen_random_uuid(), 't', 'k', 3, 'T', 'ok', now(), '{"a":"b"}')`)
	require.NoError(t, err)
	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "i/0"})
	require.NoError(t, err)
	defer f.Close()
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Events, 1)
	require.Equal(t, "ok", string(b.Events[0].Payload))
	require.Len(t, b.Invalid, 2)
	require.Contains(t, b.Invalid[0].Reason, "topic is empty")
	require.Contains(t, b.Invalid[1].Reason, "headers")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := New(nil, &Config{Schema: "bad-name; drop"})
	require.ErrorContains(t, err, "Config.Schema")
	_, err = New(nil, &Config{Partitions: -1})
	require.ErrorContains(t, err, "Config.Partitions")
}

func TestPartitionsSplitKeys(t *testing.T) {
	t.Parallel()
	drv, err := New(ferrypgtest.Pool(t), &Config{Schema: ferrypgtest.Schema(t), Partitions: 4})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	var evs []*ferryevent.Event
	for i := range 200 {
		evs = append(evs, ferrydrivertest.Event("t", "key-"+strconv.Itoa(i%40), strconv.Itoa(i)))
	}
	require.NoError(t, drv.Append(ctx, evs))
	seen := map[string]int{}
	for p := range 4 {
		r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
		_ = r.Feed.Close()
		f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "p/" + strconv.Itoa(p), Partition: p})
		require.NoError(t, err)
		r.Feed = f
		got := r.ReadQuiet(ctx)
		require.NotEmpty(t, got, "partition %d gets some keys", p)
		for _, e := range got {
			require.Equal(t, p, drv.PartitionOf(e.Key))
			seen[e.ID.String()]++
		}
		_ = f.Close()
	}
	require.Len(t, seen, 200)
	_, err = drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "p/4", Partition: 4})
	require.ErrorContains(t, err, "out of range")
}

// TestFeedPastInt32Ids: ids above 2^31-1 are read like any other (the
// feed's parameters are bigint, not int).
func TestFeedPastInt32Ids(t *testing.T) {
	t.Parallel()
	drv := newTestDriver(t)
	ctx := context.Background()
	_, err := ferrypgtest.Pool(t).Exec(ctx, `ALTER SEQUENCE `+pgx.Identifier{drv.cfg.Schema}.Sanitize()+`.outbox_id_seq RESTART WITH 2147483600`)
	require.NoError(t, err)
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	for round := range 3 {
		var evs []*ferryevent.Event
		for i := range 60 {
			evs = append(evs, ferrydrivertest.Event("t", "k"+strconv.Itoa(i%7), strconv.Itoa(round)))
		}
		require.NoError(t, drv.Append(ctx, evs))
		got := r.ReadQuiet(ctx)
		require.Len(t, got, 60, "round %d", round)
	}
}

// TestRetentionIsBoundedByItsLimit: the retention statement looks at the
// $5 oldest rows at or below the cursor. With statistics taken on an empty
// outbox, the planner read every row below the cursor (bitmap scan and
// sort: 878 buffers for 20,000 rows in a probe); in the transaction
// DeleteDelivered uses, it reads the first entries of the primary key.
func TestRetentionIsBoundedByItsLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	_, err := ferrypgtest.Pool(t).Exec(ctx, `VACUUM ANALYZE `+s+`.outbox`)
	require.NoError(t, err)
	fillBacklog(t, drv, 20_000)
	// Partition 0, cursor 19,990, no running transactions, retention 24 h,
	// limit 100, xmax beyond every row.
	args := []any{0, int64(19_990), []string{}, (24 * time.Hour).Milliseconds(), 100, "999999999"}
	var raw []byte
	require.NoError(t, drv.inIndexPlanTx(ctx, func(e executor) error {
		// Nothing is old enough to go: the statement only reads.
		return queryRow(ctx, e, []any{&raw}, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.deleteDelivered, args...)
	}))
	buffers, _ := planBuffers(t, raw)
	t.Logf("retention over 20,000 rows below the cursor, limit 100: %d buffers", buffers)
	require.Less(t, buffers, 60, "retention must read O(limit) rows whatever the statistics:\n%s", raw)

	// And it still deletes what is old enough.
	_, err = ferrypgtest.Pool(t).Exec(ctx, `UPDATE `+s+`.outbox SET created_at = now() - interval '2 days' WHERE id <= 10`)
	require.NoError(t, err)
	var n int64
	require.NoError(t, drv.inIndexPlanTx(ctx, func(e executor) error {
		var err error
		n, err = e.exec(ctx, drv.queries.deleteDelivered, args...)
		return err
	}))
	require.EqualValues(t, 10, n)
}

// TestHeartbeatLagIsBounded: the relay refreshes its lag every heartbeat
// (5 s by default). What it runs must cost the same over 200,000 events of
// lag and 100,000 dead letters as over a handful, whatever the statistics
// (taken here on an empty outbox): before, it was FeedStatus's count(*)
// over the lag and over the feed's dead letters, O(lag + dead letters)
// every heartbeat. The exact statements, now only for `ferry status
// --exact`, are measured too, for comparison. Buffers are compared, not
// times.
func TestHeartbeatLagIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	pool := ferrypgtest.Pool(t)
	_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.outbox, `+s+`.dead_letters`)
	require.NoError(t, err)
	explain := func(indexPlans bool, query string, args ...any) int {
		t.Helper()
		var raw []byte
		run := func(e executor) error {
			return queryRow(ctx, e, []any{&raw}, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+query, args...)
		}
		if indexPlans {
			require.NoError(t, drv.inIndexPlanTx(ctx, run))
		} else {
			require.NoError(t, run(drv.db))
		}
		buffers, _ := planBuffers(t, raw)
		return buffers
	}
	const feed = "hb/0"
	heartbeat := func() int {
		return explain(true, drv.queries.feedLag, 0, int64(0), ferrydriver.ExactCountLimit)
	}
	deadLetters := func() int {
		return explain(false, drv.queries.countDeadLetter, feed, ferrydriver.ExactCountLimit+1)
	}

	fillBacklog(t, drv, 10)
	smallLag, smallDL := heartbeat(), deadLetters()
	lag, err := drv.FeedLag(ctx, &ferrydriver.FeedLagParams{Feed: feed})
	require.NoError(t, err)
	require.EqualValues(t, 10, lag.Events)
	require.False(t, lag.Estimated)

	n := 200_000
	if testing.Short() {
		n = 100_000
	}
	fillBacklog(t, drv, n)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.dead_letters (feed, event_id, topic, key, seq, type, source, content_type, payload, created_at, reason)
		SELECT $1, gen_random_uuid(), 'orders', 'k' || g, 1, 'T', '', '', '\x00', now(), 'unroutable' FROM generate_series(1, 100000) g`, feed)
	require.NoError(t, err)
	bigLag, bigDL := heartbeat(), deadLetters()
	exactLag := explain(false, drv.queries.feedLagExact, 0, int64(0))
	exactDL := explain(false, drv.queries.countDeadLetterExact, feed)
	t.Logf("heartbeat lag: %d buffers at 10 events, %d at %d; dead letters counted to %d: %d buffers at 0, %d at 100,000; exact (status --exact): lag %d, dead letters %d buffers",
		smallLag, bigLag, n+10, ferrydriver.ExactCountLimit, smallDL, bigDL, exactLag, exactDL)
	require.Less(t, bigLag, 120, "the heartbeat's lag must touch O(ExactCountLimit) pages, not O(lag)")
	// An index-only range of at most ExactCountLimit+1 entries of the
	// primary key; until VACUUM sets the visibility map each entry may
	// cost a heap page (event IDs are random, so the heap is in another
	// order). Bounded, whatever the number of dead letters.
	require.Less(t, bigDL, ferrydriver.ExactCountLimit+64, "counting dead letters without Exact must touch O(ExactCountLimit) pages")
	require.Greater(t, exactLag, 10*bigLag, "the exact count does grow with the lag (a sanity check of the setup)")

	lag, err = drv.FeedLag(ctx, &ferrydriver.FeedLagParams{Feed: feed})
	require.NoError(t, err)
	require.True(t, lag.Estimated)
	require.InEpsilon(t, n+10, lag.Events, 0.05, "one partition, no gaps: the estimate is close")
	st, err := drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: feed})
	require.NoError(t, err)
	require.True(t, st.LagEstimated)
	require.True(t, st.DeadLettersMore)
	require.EqualValues(t, ferrydriver.ExactCountLimit, st.DeadLetters)
	st, err = drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: feed, Exact: true})
	require.NoError(t, err)
	require.False(t, st.LagEstimated)
	require.EqualValues(t, n+10, st.LagEvents)
	require.EqualValues(t, 100_000, st.DeadLetters)
}

// TestDeadLetterRetentionIsBounded: the relay's retention pass removes
// expired dead letters a chunk at a time. Over 100,000 dead letters (with
// statistics taken when there were none) it reads O(chunk) index entries:
// none when nothing is old enough, the chunk when everything is.
func TestDeadLetterRetentionIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	pool := ferrypgtest.Pool(t)
	_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.dead_letters`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.dead_letters (feed, event_id, topic, key, seq, type, source, content_type, payload, created_at, reason)
		SELECT 'dl/' || (g % 2), gen_random_uuid(), 'orders', 'k' || g, 1, 'T', '', '', '\x00', now(), 'unroutable' FROM generate_series(1, 100000) g`)
	require.NoError(t, err)
	explain := func(olderThan time.Duration) (int, []byte) {
		t.Helper()
		var raw []byte
		errMeasured := errors.New("measured") // rolls the delete back
		err := drv.inIndexPlanTx(ctx, func(e executor) error {
			err := queryRow(ctx, e, []any{&raw}, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.deleteDeadLetters, "dl/0", olderThan.Milliseconds(), 100)
			if err != nil {
				return err
			}
			return errMeasured
		})
		require.ErrorIs(t, err, errMeasured)
		buffers, _ := planBuffers(t, raw)
		return buffers, raw
	}
	young, raw := explain(time.Hour)
	require.Less(t, young, 10, "nothing is old enough: an empty index range\n%s", raw)
	old, raw := explain(0)
	t.Logf("dead letter retention over 100,000 dead letters, chunk 100: %d buffers when none expired, %d when all did", young, old)
	require.Less(t, old, 600, "a chunk of 100 costs O(100) pages\n%s", raw)
	n, err := drv.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: "dl/0", Limit: 100})
	require.NoError(t, err)
	require.EqualValues(t, 100, n)
}

// TestKeySeqPruneIsBounded: the relay forgets idle keys' numbers a chunk
// at a time in primary-key order. Over 100,000 keys of a feed, with
// statistics taken on an empty table, a chunk of 100 touches O(chunk)
// pages, wherever the sweep stands; kept keys stay, and the sweep says
// where it goes on.
func TestKeySeqPruneIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newTestDriver(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	pool := ferrypgtest.Pool(t)
	_, err := pool.Exec(ctx, `VACUUM ANALYZE `+s+`.feed_seqs`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.feed_seqs (feed, key, seq, touched_at)
		SELECT f, 'k' || lpad(g::text, 6, '0'), 1, now() - interval '2 days'
		  FROM generate_series(1, 100000) g, (VALUES ('f/0'), ('other/0')) v(f)`)
	require.NoError(t, err)
	measure := func(after string) int {
		t.Helper()
		var raw []byte
		errMeasured := errors.New("measured") // rolls the delete back
		err := drv.inIndexPlanTx(ctx, func(e executor) error {
			if err := queryRow(ctx, e, []any{&raw}, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+drv.queries.pruneKeySeqs,
				"f/0", after, 100, (24 * time.Hour).Milliseconds(), []string{}); err != nil {
				return err
			}
			return errMeasured
		})
		require.ErrorIs(t, err, errMeasured)
		n, _ := planBuffers(t, raw)
		return n
	}
	start, end := measure(""), measure("k099800")
	t.Logf("forgetting idle keys over 100,000 keys of a feed, chunk 100: %d / %d buffers (start / end of the table)", start, end)
	// Per key: a probe of the primary key for the delete's join, and the delete.
	require.Less(t, max(start, end), 1000, "a chunk of 100 touches O(chunk) pages")

	res, err := drv.PruneKeySeqs(ctx, &ferrydriver.PruneKeySeqsParams{Feed: "f/0", IdleFor: 24 * time.Hour, After: "k000100", Limit: 100, Keep: []string{"k000150"}})
	require.NoError(t, err)
	require.Len(t, res.Pruned, 99, "the chunk's idle keys, but the kept one")
	require.NotContains(t, res.Pruned, "k000150")
	require.Equal(t, "k000200", res.Next)
	left, err := drv.LoadKeySeqs(ctx, "f/0", []string{"k000100", "k000101", "k000150", "k000201"})
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"k000100": 1, "k000150": 1, "k000201": 1}, left)
	left, err = drv.LoadKeySeqs(ctx, "other/0", []string{"k000101"})
	require.NoError(t, err)
	require.Len(t, left, 1, "another feed's keys stay")
	res, err = drv.PruneKeySeqs(ctx, &ferrydriver.PruneKeySeqsParams{Feed: "f/0", IdleFor: 3 * 24 * time.Hour, After: "k099950", Limit: 100})
	require.NoError(t, err)
	require.Empty(t, res.Pruned, "not idle for long enough")
	require.Empty(t, res.Next, "the end of the feed's keys")
}

// TestBusyFeedTicksApart: while events keep coming a tick starts hotTick
// after the one before ended, not at once after a tick that returned
// events (at a moderate rate that second tick found nothing half the
// time: two reads for the events of one).
func TestBusyFeedTicksApart(t *testing.T) {
	t.Parallel()
	drv := newTestDriver(t)
	ctx := context.Background()
	emit := func() {
		t.Helper()
		require.NoError(t, drv.Append(ctx, []*ferryevent.Event{{ID: ferryevent.NewID(), Topic: "t", Key: "k", Type: "T", Payload: []byte("{}"), CreatedAt: time.Now()}}))
	}
	ff, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "hot/0"})
	require.NoError(t, err)
	defer ff.Close()
	f := ff.(*feed[pgx.Tx])
	emit()
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Events, 1) // the feed is hot now
	for i := range 3 {
		emit()
		// As if a tick had just ended: the next one waits out hotTick.
		start := time.Now()
		f.tickedAt = start
		b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
		require.NoError(t, err)
		require.Len(t, b.Events, 1)
		require.GreaterOrEqual(t, time.Since(start), hotTick, "read %d", i)
	}
}
