package ferryui_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryui/ferryuitest"
)

// BenchmarkPagesAtScale times every API call the console makes on a
// PostgreSQL database holding FERRY_BENCH_OUTBOX undelivered events
// (default 1,000,000) over 4 partitions, 100,000 relay dead letters and a
// group with 100,000 dead events (each with a history of 20 attempts),
// 100,000 processed ones and 100,000 pending ones (ferryuitest.BenchmarkPages
// lists the calls):
//
//	go test -run '^$' -bench PagesAtScale -benchtime 20x ./ferryui
//
// Seeding takes about a minute; each sub-benchmark reports ms/call.
func BenchmarkPagesAtScale(b *testing.B) {
	outbox := ferryuitest.BenchOutboxSize(b)
	const dead = 100_000
	ctx := context.Background()
	schema := ferrypgtest.Schema(b)
	pool := ferrypgtest.Pool(b)
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema, Partitions: 4})
	require.NoError(b, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(b, err)
	s := pgx.Identifier{schema}.Sanitize()
	start := time.Now()
	for _, q := range []string{
		`INSERT INTO ` + s + `.outbox (partition, event_id, topic, key, seq, type, payload, created_at)
		 SELECT i % 4, gen_random_uuid(), 'orders', 'customer-' || (i % 50000), i / 50000 + 1, 'OrderPlaced', '\x7b7d', now() - (i * interval '1 millisecond')
		   FROM generate_series(1, ` + strconv.Itoa(outbox) + `) i`,
		`INSERT INTO ` + s + `.dead_letters (feed, event_id, topic, key, seq, type, source, content_type, payload, created_at, reason, failed_at)
		 SELECT 'default/' || (i % 4), gen_random_uuid(), 'orders', 'customer-' || i, 1, 'OrderPlaced', 'ferry', '', '\x7b7d', now(),
		        'refused: ' || (i % 7), now() - (i / 500) * interval '1 second' FROM generate_series(1, ` + strconv.Itoa(dead) + `) i`,
		`INSERT INTO ` + s + `.inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, finished_at, last_error)
		 SELECT 'billing', gen_random_uuid(), 'customer-' || i, 1, 'orders', 'OrderPlaced', '\x7b7d', now(),
		        CASE WHEN i % 2 = 0 THEN 'dead' ELSE 'processed' END, now() - i * interval '1 millisecond', 'declined ' || (i % 5)
		   FROM generate_series(1, ` + strconv.Itoa(2*dead) + `) i`,
		// A backlog as large: PENDING events waiting behind.
		`INSERT INTO ` + s + `.inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state)
		 SELECT 'billing', gen_random_uuid(), 'customer-' || (i % 50000), i, 'orders', 'OrderPlaced', '\x7b7d', now(), 'pending'
		   FROM generate_series(1, ` + strconv.Itoa(dead) + `) i`,
		// Each dead event's history: the 20 failed attempts kept.
		`UPDATE ` + s + `.inbox SET attempts = 20, attempt_log = (SELECT jsonb_agg(jsonb_build_object('n', n, 'state', 'failed', 'error', 'declined: ' || repeat('x', 200), 'at', now()))
		   FROM generate_series(1, 20) n) WHERE state = 'dead'`,
		`INSERT INTO ` + s + `.inbox_keys (group_name, key, runnable_at) SELECT 'billing', 'customer-' || i, NULL FROM generate_series(1, ` + strconv.Itoa(2*dead) + `) i`,
		`INSERT INTO ` + s + `.inbox_groups (group_name, hold_dead) VALUES ('billing', true) ON CONFLICT DO NOTHING`,
		`VACUUM ANALYZE ` + s + `.outbox`, `VACUUM ANALYZE ` + s + `.dead_letters`, `VACUUM ANALYZE ` + s + `.inbox`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(b, err, q)
	}
	b.Logf("seeded %d outbox events, %d dead letters, %d inbox rows in %v", outbox, dead, 3*dead, time.Since(start).Round(time.Second))

	var deadID, deepAt, deepID, waiting string
	require.NoError(b, pool.QueryRow(ctx, `SELECT event_id::text FROM `+s+`.inbox WHERE state = 'dead' LIMIT 1`).Scan(&deadID))
	var at time.Time
	require.NoError(b, pool.QueryRow(ctx, `SELECT failed_at, event_id::text FROM `+s+`.dead_letters ORDER BY failed_at DESC, event_id OFFSET 75000 LIMIT 1`).Scan(&at, &deepID))
	deepAt = at.UTC().Format(time.RFC3339Nano)
	// An event the relay has not published, 700 events into the backlog
	// of partition 3 (no feed has a checkpoint: the relay starts from the
	// first event): found after the default scan (1,000 of each of the 4)
	// of each other partition. One that is nowhere costs the scan of every
	// partition.
	require.NoError(b, pool.QueryRow(ctx, `SELECT event_id::text FROM `+s+`.outbox WHERE partition = 3 ORDER BY id OFFSET 700 LIMIT 1`).Scan(&waiting))
	ferryuitest.BenchmarkPages(b, drv, drv, ferryuitest.BenchPages{DeadEvent: deadID, Waiting: waiting, DeepCursor: deepAt + "," + deepID, Key: "customer-42"})
}
