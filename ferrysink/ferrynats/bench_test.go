package ferrynats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
)

// BenchmarkPublish publishes calls of 1,000 events over 500 keys, each
// with a small JSON payload and one header, into a file-backed stream, and
// reports events per second. The sink ignores keys, so two events of a key
// in one call (which the relay never makes) cost the same as distinct keys.
//
//	go test -run xxx -bench Publish
//
// Under a relay fence, on the shared connection ("plain") and on one made
// with WriteFence ("write-fence"), which checks the fences on every write.
func BenchmarkPublish(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchmarkPublish(b, testConn(b)) })
	b.Run("write-fence", func(b *testing.B) { benchmarkPublish(b, fencedConn(b, ferrynats.WriteFence())) })
}

func benchmarkPublish(b *testing.B, nc *nats.Conn) {
	ctx := ferrysink.WithFence(context.Background(), func() error { return nil })
	stream, prefix := testNames(b)
	sink, err := ferrynats.New(context.Background(), nc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := sink.Close(context.Background()); err != nil {
			b.Error(err)
		}
	})

	const batchSize, keys = 1000, 500
	batch := make([]*ferryevent.Event, batchSize)
	for i := range batch {
		key := fmt.Sprintf("order-%d", i%keys)
		batch[i] = &ferryevent.Event{
			Topic:       "orders",
			Key:         key,
			Type:        "OrderPlaced",
			Source:      "bench",
			Headers:     map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			ContentType: "application/json",
			Payload:     fmt.Appendf(nil, `{"order":%q,"items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total":4250}`, key),
			CreatedAt:   time.Now(),
			Seq:         int64(i/keys + 1),
		}
	}

	b.ReportAllocs()
	for b.Loop() {
		// Fresh IDs, or the stream would drop every call after the first
		// as duplicates.
		for _, ev := range batch {
			ev.ID = ferryevent.NewID()
		}
		for i, err := range sink.Publish(ctx, batch) {
			if err != nil {
				b.Fatalf("event %d: %v", i, err)
			}
		}
	}
	b.ReportMetric(float64(b.N*batchSize)/b.Elapsed().Seconds(), "events/s")
}
