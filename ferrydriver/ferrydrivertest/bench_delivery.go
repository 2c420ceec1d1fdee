package ferrydrivertest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// claimLoopOnly is an inbox whose ingest does not claim: its consumer
// finds every event by a claim of its own.
type claimLoopOnly[TTx any] struct{ ferrydriver.Inbox[TTx] }

// BenchDeliveryLatency delivers b.N events, one per Ingest every 5 ms
// (200/s) over 100 keys, to a running consumer of 8 workers whose handler
// does nothing, and reports the time from each Ingest's call to its
// handler's (delivery-p50-ms, delivery-p99-ms), in two runs: the inbox as
// it is ("ingest-claims", when it implements
// ferrydriver.InboxIngestClaimer) and with its ingest claiming nothing
// ("claim-loop"). newInbox returns an inbox over a fresh namespace.
func BenchDeliveryLatency[TTx any](b *testing.B, newInbox func(b *testing.B) ferrydriver.Inbox[TTx]) {
	b.Run("ingest-claims", func(b *testing.B) { benchDelivery(b, newInbox(b)) })
	b.Run("claim-loop", func(b *testing.B) { benchDelivery[TTx](b, claimLoopOnly[TTx]{newInbox(b)}) })
}

func benchDelivery[TTx any](b *testing.B, inbox ferrydriver.Inbox[TTx]) {
	c, err := ferry.NewConsumer(inbox, &ferry.ConsumerConfig{Group: "bench", Workers: 8})
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	start := map[uuid.UUID]time.Time{}
	var lat []time.Duration
	all := make(chan struct{})
	c.HandleAll(func(_ context.Context, _ TTx, ev *ferry.Event) error {
		mu.Lock()
		defer mu.Unlock()
		lat = append(lat, time.Since(start[ev.ID]))
		if len(lat) == b.N {
			close(all)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	time.Sleep(200 * time.Millisecond) // Run records the policy and starts claiming
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	b.ResetTimer()
	for i := range b.N {
		<-tick.C
		ev := &ferryevent.Event{ID: uuid.Must(uuid.NewV7()), Topic: "t", Key: "k" + strconv.Itoa(i%100), Type: "T", Payload: []byte(`{}`), CreatedAt: time.Now()}
		mu.Lock()
		start[ev.ID] = time.Now()
		mu.Unlock()
		if _, err := c.Ingest(ctx, []*ferryevent.Event{ev}); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
	}
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	if len(lat) < b.N {
		b.Fatalf("%d of %d events handled within a minute", len(lat), b.N)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "delivery-p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "delivery-p99-ms")
}
