package ferrywebhook_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// BenchmarkPublish publishes calls of 256 events of distinct keys, each
// with a small JSON payload and one header, signed, to a local endpoint
// that reads the body and answers 204 without verifying, and reports events
// per second. It measures the sink and net/http on loopback, with the
// endpoint on the same machine: a real receiver's latency bounds a real
// relay.
//
//	go test -run '^$' -bench Publish ./ferrysink/ferrywebhook/
func BenchmarkPublish(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	sink, err := ferrywebhook.New(&ferrywebhook.Config{URL: srv.URL, Secrets: []string{secret}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := sink.Close(context.Background()); err != nil {
			b.Error(err)
		}
	})

	const batchSize = 256
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

	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		for i, err := range sink.Publish(ctx, batch) {
			if err != nil {
				b.Fatalf("event %d: %v", i, err)
			}
		}
	}
	b.ReportMetric(float64(b.N*batchSize)/b.Elapsed().Seconds(), "events/s")
}
