package ferrykafka_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
)

// BenchmarkPublish measures events/s into a kfake cluster in the same
// process (so the figure includes the broker's work), in calls of 500
// events over 500 keys, as the relay sends them.
func BenchmarkPublish(b *testing.B) {
	c := benchCluster(b)
	sink, err := ferrykafka.New(context.Background(), &ferrykafka.Config{Brokers: c, Topic: func(*ferryevent.Event) string { return "orders" }})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close(context.Background())
	const batch = 500
	events := make([]*ferryevent.Event, batch)
	for i := range events {
		events[i] = &ferryevent.Event{Topic: "orders", Key: "customer-" + strconv.Itoa(i), Type: "OrderPlaced", Payload: make([]byte, 200)}
		if err := ferryevent.Prepare(events[i], 0, 0, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		if err := errors.Join(sink.Publish(context.Background(), events)...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "events/s")
}
