package ferrymysql_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
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
