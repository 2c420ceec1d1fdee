package ferryui_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferryui"
	"github.com/ferry-dev/ferry/internal/pgtest"
)

// BenchmarkPagesAtScale times every API call the console makes on a
// PostgreSQL database holding FERRY_BENCH_OUTBOX undelivered events
// (default 1,000,000) over 4 partitions, 100,000 relay dead letters and a
// group with 100,000 dead events and 100,000 processed ones:
//
//	go test -run '^$' -bench PagesAtScale -benchtime 20x ./ferryui
//
// Seeding takes about a minute; each sub-benchmark reports ms/call.
func BenchmarkPagesAtScale(b *testing.B) {
	outbox := 1_000_000
	if v := os.Getenv("FERRY_BENCH_OUTBOX"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err)
		outbox = n
	}
	const dead = 100_000
	ctx := context.Background()
	schema := pgtest.Schema(b)
	pool := pgtest.Pool(b)
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
		`INSERT INTO ` + s + `.inbox_keys (group_name, key, runnable_at) SELECT 'billing', 'customer-' || i, NULL FROM generate_series(1, ` + strconv.Itoa(2*dead) + `) i`,
		`INSERT INTO ` + s + `.inbox_groups (group_name, hold_dead) VALUES ('billing', true) ON CONFLICT DO NOTHING`,
		`VACUUM ANALYZE ` + s + `.outbox`, `VACUUM ANALYZE ` + s + `.dead_letters`, `VACUUM ANALYZE ` + s + `.inbox`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(b, err, q)
	}
	b.Logf("seeded %d outbox events, %d dead letters, %d inbox rows in %v", outbox, dead, 2*dead, time.Since(start).Round(time.Second))

	h, err := ferryui.New(&ferryui.Config{Store: drv, Inbox: drv, ReadOnly: true})
	require.NoError(b, err)
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	var deadID, deepCursor string
	require.NoError(b, pool.QueryRow(ctx, `SELECT event_id::text FROM `+s+`.inbox WHERE state = 'dead' LIMIT 1`).Scan(&deadID))
	var at time.Time
	var id string
	require.NoError(b, pool.QueryRow(ctx, `SELECT failed_at, event_id::text FROM `+s+`.dead_letters ORDER BY failed_at DESC, event_id OFFSET 75000 LIMIT 1`).Scan(&at, &id))
	deepCursor = url.QueryEscape(at.UTC().Format(time.RFC3339Nano) + "," + id)
	for _, c := range []struct{ name, path string }{
		{"feeds", "/api/v1/feeds"},
		{"dead-letters/first-page", "/api/v1/dead-letters"},
		{"dead-letters/deep-page", "/api/v1/dead-letters?after=" + deepCursor},
		{"dead-letters/page-of-500", "/api/v1/dead-letters?limit=500"},
		{"groups", "/api/v1/groups"},
		{"group-dead-events", "/api/v1/groups/billing/events?state=dead&limit=500"},
		{"dead-letters/reasons", "/api/v1/dead-letters/reasons"},
		{"group-dead-reasons", "/api/v1/groups/billing/reasons"},
		{"event-timeline", "/api/v1/events/" + deadID},
		{"key", "/api/v1/keys/customer-42"},
		{"parked", "/api/v1/parked"},
		{"console-page", "/"},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				resp, err := http.Get(srv.URL + c.path)
				require.NoError(b, err)
				_, err = io.Copy(io.Discard, resp.Body)
				require.NoError(b, err)
				resp.Body.Close()
				require.Equal(b, http.StatusOK, resp.StatusCode, c.path)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/call")
			b.ReportMetric(0, "ns/op")
		})
	}
}
