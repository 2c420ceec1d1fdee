package ferryrabbit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
)

// BenchmarkPublish publishes calls of 500 events over 500 keys, each with a
// small JSON payload and one header, as persistent messages routed to one
// durable queue, and reports events per second. 20 iterations publish 10,000
// events:
//
//	go test -run '^$' -bench Publish -benchtime 20x
func BenchmarkPublish(b *testing.B) {
	for _, queue := range []struct {
		name string
		args amqp.Table
	}{
		{"classic", nil},
		{"quorum", amqp.Table{"x-queue-type": "quorum"}},
	} {
		b.Run(queue.name, func(b *testing.B) {
			ctx := context.Background()
			top := newTopology(b, queue.args, "#")
			sink, err := ferryrabbit.New(ctx, &ferryrabbit.Config{URL: testURL(b), Exchange: top.exchange, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				if err := sink.Close(ctx); err != nil {
					b.Error(err)
				}
			})

			const batchSize = 500
			batch := make([]*ferryevent.Event, batchSize)
			for i := range batch {
				key := fmt.Sprintf("order-%d", i)
				batch[i] = &ferryevent.Event{
					ID:          ferryevent.NewID(),
					Topic:       "orders",
					Key:         key,
					Type:        "OrderPlaced",
					Source:      "bench",
					Headers:     map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
					ContentType: "application/json",
					Payload:     fmt.Appendf(nil, `{"order":%q,"items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total":4250}`, key),
					CreatedAt:   time.Now(),
					Seq:         1,
				}
			}

			b.ReportAllocs()
			for b.Loop() {
				for i, err := range sink.Publish(ctx, batch) {
					if err != nil {
						b.Fatalf("event %d: %v", i, err)
					}
				}
			}
			b.ReportMetric(float64(b.N*batchSize)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
