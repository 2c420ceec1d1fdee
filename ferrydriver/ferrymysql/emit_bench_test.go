package ferrymysql_test

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
)

// BenchmarkEmitTx: producer transactions of one event each (500 keys)
// from 8 goroutines, as an application writes them.
//
//	cd ferrydriver/ferrymysql && go test -run '^$' -bench EmitTx -benchtime 5s
func BenchmarkEmitTx(b *testing.B) {
	drv := newDriverB(b)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(b, err)
	ctx := context.Background()
	var n atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for n.Add(1) <= int64(b.N) {
				tx, err := drv.DB().BeginTx(ctx, nil)
				require.NoError(b, err)
				ev := &ferry.Event{Topic: "orders", Key: "customer-" + strconv.Itoa(rand.IntN(500)), Type: "T", Payload: []byte(`{"x":1}`)}
				require.NoError(b, c.EmitTx(ctx, tx, ev))
				require.NoError(b, tx.Commit())
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	_ = time.Now
}

// BenchmarkDeliveryLatency: an Ingest's call to its handler's, one event
// every 5 ms, with the ingest's claims and without
// (ferrydrivertest.BenchDeliveryLatency).
//
//	cd ferrydriver/ferrymysql && go test -run '^$' -bench DeliveryLatency -benchtime 2000x
func BenchmarkDeliveryLatency(b *testing.B) {
	ferrydrivertest.BenchDeliveryLatency(b, func(b *testing.B) ferrydriver.Inbox[*sql.Tx] { return newDriverB(b) })
}
