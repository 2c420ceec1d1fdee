package ferry_test

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// benchClient returns a client on a fresh, migrated schema.
func benchClient(b *testing.B, cfg *ferrypg.Config) (*ferrypg.Driver[pgx.Tx], *ferry.Client[pgx.Tx]) {
	b.Helper()
	c := ferrypg.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = ferrypgtest.Schema(b)
	drv, err := ferrypg.New(ferrypgtest.Pool(b), &c)
	require.NoError(b, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(b, err)
	client, err := ferry.NewClient(drv, nil)
	require.NoError(b, err)
	return drv, client
}

// BenchmarkEmitTx measures producer transactions (BEGIN; EmitTx of one
// event; COMMIT) from parallel goroutines (-cpu sets their number x GOMAXPROCS).
func BenchmarkEmitTx(b *testing.B) {
	for _, notify := range []bool{true, false} {
		b.Run("notify="+strconv.FormatBool(notify), func(b *testing.B) {
			_, c := benchClient(b, &ferrypg.Config{DisableNotify: !notify})
			pool := ferrypgtest.Pool(b)
			var n atomic.Int64
			b.SetParallelism(4)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					i := n.Add(1)
					ev := &ferry.Event{Topic: "orders", Key: "k" + strconv.Itoa(int(i%500)), Type: "T", Payload: make([]byte, 256)}
					if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return c.EmitTx(ctx, tx, ev) }); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
		})
	}
}

// BenchmarkRelayDrain measures the relay's hot path (feed read, waves,
// checkpoint) from a PostgreSQL backlog into an in-memory sink.
func BenchmarkRelayDrain(b *testing.B) {
	drv, c := benchClient(b, nil)
	ctx := context.Background()
	b.StopTimer()
	for i := 0; i < b.N; i += 100 {
		evs := make([]*ferry.Event, min(100, b.N-i))
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
	b.StartTimer()
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	for sink.Len() < b.N {
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	b.StopTimer()
	cancel()
	require.NoError(b, <-done)
}

// BenchmarkFeedRead measures reading batches of 500 from a 50k backlog
// (one batch per iteration; the feed restarts from the beginning when done).
func BenchmarkFeedRead(b *testing.B) {
	drv, c := benchClient(b, nil)
	ctx := context.Background()
	const backlog = 50000
	for i := 0; i < backlog; i += 500 {
		evs := make([]*ferry.Event, 500)
		for j := range evs {
			evs[j] = &ferry.Event{Topic: "orders", Key: "k" + strconv.Itoa((i+j)%500), Type: "T", Payload: make([]byte, 256)}
		}
		require.NoError(b, c.Emit(ctx, evs...))
	}
	open := func() ferrydriver.Feed {
		f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "bench/0"})
		require.NoError(b, err)
		return f
	}
	f := open()
	defer func() { _ = f.Close() }()
	read := 0
	for b.Loop() {
		batch, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 500, Wait: time.Second})
		require.NoError(b, err)
		read += len(batch.Events)
		if len(batch.Events) < 500 {
			_ = f.Close()
			f = open()
		}
	}
	b.ReportMetric(float64(read)/b.Elapsed().Seconds(), "events/s")
}
