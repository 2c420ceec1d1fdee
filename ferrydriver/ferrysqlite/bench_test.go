package ferrysqlite_test

import (
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/ferry-dev/ferry/ferryui/ferryuitest"
	"github.com/stretchr/testify/require"
)

func benchDriver(b *testing.B, sync string) (*ferrysqlite.Driver, *ferry.Client[*sql.Tx]) {
	b.Helper()
	drv, err := ferrysqlite.Open(filepath.Join(b.TempDir(), "bench.db"), &ferrysqlite.Config{Synchronous: sync})
	require.NoError(b, err)
	b.Cleanup(func() { _ = drv.Close() })
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(b, err)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(b, err)
	return drv, c
}

// BenchmarkEmitTx: producer transactions of one event each (256-byte
// payload, 500 keys) from 4 goroutines, as an application writes them.
//
//	cd ferrydriver/ferrysqlite && go test -run '^$' -bench EmitTx
func BenchmarkEmitTx(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		b.Run("synchronous="+sync, func(b *testing.B) {
			drv, c := benchDriver(b, sync)
			var n atomic.Int64
			b.SetParallelism(2) // 2 x GOMAXPROCS goroutines
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					i := n.Add(1)
					ev := &ferry.Event{Topic: "orders", Key: "k" + strconv.Itoa(int(i%500)), Type: "T", Payload: make([]byte, 256)}
					tx, err := drv.DB().BeginTx(ctx, nil)
					if err != nil {
						b.Error(err)
						return
					}
					if err := c.EmitTx(ctx, tx, ev); err != nil {
						_ = tx.Rollback()
						b.Error(err)
						return
					}
					if err := tx.Commit(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
		})
	}
}

// BenchmarkRelayDrain: the relay's path (feed read, waves, checkpoints)
// from a SQLite backlog into an in-memory sink.
//
//	cd ferrydriver/ferrysqlite && go test -run '^$' -bench RelayDrain -benchtime 100000x
func BenchmarkRelayDrain(b *testing.B) {
	drv, c := benchDriver(b, "NORMAL")
	ctx := context.Background()
	for i := 0; i < b.N; i += 500 {
		evs := make([]*ferry.Event, min(500, b.N-i))
		for j := range evs {
			evs[j] = &ferry.Event{Topic: "orders", Key: "k" + strconv.Itoa((i+j)%500), Type: "T", Payload: make([]byte, 256)}
		}
		require.NoError(b, c.Emit(ctx, evs...))
	}
	sink := &memsink.Sink{}
	r, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{BatchSize: 1000, PollInterval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	for sink.Len() < b.N {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	require.NoError(b, <-done)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
}

// BenchmarkConsume applies a backlog with exactly-once effect (an upsert
// of a per-customer projection and the inbox record per event), one event
// per transaction and in batches: b.N events over 500 keys.
func BenchmarkConsume(b *testing.B) {
	for _, sync := range []string{"NORMAL", "FULL"} {
		for _, m := range []struct {
			batch int
			sp    bool
		}{{1, false}, {32, false}, {32, true}} {
			batch := m.batch
			name := "synchronous=" + sync + "/BatchSize=" + strconv.Itoa(batch)
			if m.sp {
				name += "/SavepointEach"
			}
			b.Run(name, func(b *testing.B) {
				drv, _ := benchDriver(b, sync)
				ctx := context.Background()
				_, err := drv.DB().Exec(`CREATE TABLE projection (customer TEXT PRIMARY KEY, orders INTEGER NOT NULL, last_seq INTEGER NOT NULL)`)
				require.NoError(b, err)
				c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "bench", BatchSize: batch, SavepointEach: m.sp, PollInterval: 5 * time.Millisecond,
					Logger: slog.New(slog.DiscardHandler)})
				require.NoError(b, err)
				var applied atomic.Int64
				c.HandleAll(func(ctx context.Context, tx *sql.Tx, ev *ferry.Event) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO projection (customer, orders, last_seq) VALUES (?, 1, ?)
						ON CONFLICT (customer) DO UPDATE SET orders = orders + 1, last_seq = excluded.last_seq`, ev.Key, ev.Seq)
					return err
				})
				// Count after the commit: a wrapper would be more exact, the
				// projection's sum is exact too and cheap at the end.
				evs := make([]*ferry.Event, b.N)
				for i := range evs {
					evs[i] = &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: "customer-" + strconv.Itoa(i%500), Type: "OrderPlaced",
						Seq: int64(i/500 + 1), Payload: []byte(`{"n":1}`), CreatedAt: time.Now()}
				}
				for i := 0; i < len(evs); i += 1000 {
					_, err := c.Ingest(ctx, evs[i:min(i+1000, len(evs))])
					require.NoError(b, err)
				}
				rctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				b.ResetTimer()
				start := time.Now()
				go func() { done <- c.Run(rctx) }()
				for {
					var total sql.NullInt64
					require.NoError(b, drv.DB().QueryRow(`SELECT sum(orders) FROM projection`).Scan(&total))
					if total.Int64 >= int64(b.N) {
						applied.Store(total.Int64)
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
				elapsed := time.Since(start)
				b.StopTimer()
				cancel()
				require.NoError(b, <-done)
				require.Equal(b, int64(b.N), applied.Load(), "exactly once")
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
			})
		}
	}
}

// BenchmarkPagesAtScale times every API call the console makes
// (ferryuitest.BenchmarkPages) on a SQLite database holding
// FERRY_BENCH_OUTBOX undelivered events (default 1,000,000) over 4
// partitions, 100,000 relay dead letters and a group with 100,000 dead
// events (each with a history of 20 attempts), 100,000 processed and
// 100,000 pending ones:
//
//	cd ferrydriver/ferrysqlite && go test -run '^$' -bench PagesAtScale -benchtime 20x
func BenchmarkPagesAtScale(b *testing.B) {
	outbox := ferryuitest.BenchOutboxSize(b)
	const dead = 100_000
	ctx := context.Background()
	drv, err := ferrysqlite.Open(filepath.Join(b.TempDir(), "pages.db"), &ferrysqlite.Config{Partitions: 4, Synchronous: "NORMAL"})
	require.NoError(b, err)
	b.Cleanup(func() { _ = drv.Close() })
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(b, err)
	start := time.Now()
	now := time.Now().UnixMicro()
	series := func(n int) string {
		return `WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ` + strconv.Itoa(n) + `) `
	}
	uuidOf := `lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-7' || substr(hex(randomblob(2)), 2) || '-8' || substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))`
	n := strconv.FormatInt(now, 10)
	for _, q := range []string{
		series(outbox) + `INSERT INTO ferry_outbox (partition, event_id, topic, key, seq, type, payload, created_at)
		 SELECT i % 4, ` + uuidOf + `, 'orders', 'customer-' || (i % 50000), i / 50000 + 1, 'OrderPlaced', X'7b7d', ` + n + ` - i * 1000 FROM s`,
		series(dead) + `INSERT INTO ferry_dead_letters (feed, event_id, topic, key, seq, type, source, content_type, payload, created_at, reason, failed_at)
		 SELECT 'default/' || (i % 4), ` + uuidOf + `, 'orders', 'customer-' || i, 1, 'OrderPlaced', 'ferry', '', X'7b7d', ` + n + `,
		        'refused: ' || (i % 7), ` + n + ` - (i / 500) * 1000000 FROM s`,
		series(2*dead) + `INSERT INTO ferry_inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, next_attempt_at, received_at, finished_at, last_error, attempts, attempt_log)
		 SELECT 'billing', ` + uuidOf + `, 'customer-' || i, 1, 'orders', 'OrderPlaced', X'7b7d', ` + n + `,
		        CASE WHEN i % 2 = 0 THEN 'dead' ELSE 'processed' END, ` + n + `, ` + n + `, ` + n + ` - i * 1000, 'declined ' || (i % 5), 20,
		        CASE WHEN i % 2 = 0 THEN (SELECT json_group_array(json_object('n', k, 'state', 'failed', 'error', 'declined: ' || printf('%.200c', 'x'), 'at', ` + n + `))
		                                   FROM (WITH RECURSIVE a(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM a WHERE k < 20) SELECT k FROM a)) END
		   FROM s`,
		series(dead) + `INSERT INTO ferry_inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, next_attempt_at, received_at)
		 SELECT 'billing', ` + uuidOf + `, 'customer-' || (i % 50000), i, 'orders', 'OrderPlaced', X'7b7d', ` + n + `, 'pending', ` + n + `, ` + n + ` FROM s`,
		series(2*dead) + `INSERT INTO ferry_inbox_keys (group_name, key, runnable_at) SELECT 'billing', 'customer-' || i, NULL FROM s`,
		`INSERT INTO ferry_inbox_groups (group_name, hold_dead) VALUES ('billing', 1) ON CONFLICT DO NOTHING`,
		`ANALYZE`,
	} {
		_, err := drv.DB().ExecContext(ctx, q)
		require.NoError(b, err, q)
	}
	b.Logf("seeded %d outbox events, %d dead letters, %d inbox rows in %v", outbox, dead, 3*dead, time.Since(start).Round(time.Second))
	var deadID, deepID, waiting string
	var deepAt int64
	require.NoError(b, drv.DB().QueryRowContext(ctx, `SELECT event_id FROM ferry_inbox WHERE state = 'dead' LIMIT 1`).Scan(&deadID))
	require.NoError(b, drv.DB().QueryRowContext(ctx, `SELECT failed_at, event_id FROM ferry_dead_letters ORDER BY failed_at DESC, event_id LIMIT 1 OFFSET 75000`).Scan(&deepAt, &deepID))
	// 700 events into partition 3's backlog: after the default scan
	// (1,000 of each of the 4) of each partition before it.
	require.NoError(b, drv.DB().QueryRowContext(ctx, `SELECT event_id FROM ferry_outbox WHERE partition = 3 ORDER BY id LIMIT 1 OFFSET 700`).Scan(&waiting))
	ferryuitest.BenchmarkPages(b, drv, drv, ferryuitest.BenchPages{DeadEvent: deadID, Waiting: waiting,
		DeepCursor: time.UnixMicro(deepAt).UTC().Format(time.RFC3339Nano) + "," + deepID, Key: "customer-42"})
}

// BenchmarkDeliveryLatency: an Ingest's call to its handler's, one event
// every 5 ms, with the ingest's claims and without
// (ferrydrivertest.BenchDeliveryLatency).
//
//	cd ferrydriver/ferrysqlite && go test -run '^$' -bench DeliveryLatency -benchtime 2000x
func BenchmarkDeliveryLatency(b *testing.B) {
	ferrydrivertest.BenchDeliveryLatency(b, func(b *testing.B) ferrydriver.Inbox[*sql.Tx] {
		drv, _ := benchDriver(b, "NORMAL")
		return drv
	})
}
