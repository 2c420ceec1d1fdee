package ferrynats_test

import (
	"context"
	"log"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
)

// The application dials NATS and owns the connection; the sink publishes
// through it. WriteFence carries the relay's lease fence to the socket.
// The relay normally calls Publish; it is called directly here to show the
// per-event results.
func ExampleNew() {
	ctx := context.Background()
	nc, err := nats.Connect(os.Getenv("NATS_URL"), ferrynats.WriteFence())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{
		Stream:        "ORDERS",
		SubjectPrefix: "acme.events", // topic "orders" -> subject "acme.events.orders"
		CreateStream:  true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close(ctx)

	ev := &ferryevent.Event{ID: ferryevent.NewID(), Topic: "orders", Key: "order-42", Type: "OrderPlaced", Payload: []byte(`{}`)}
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{ev}) {
		if err != nil {
			log.Print(err)
		}
	}
}

// A consumer reads events back with Decode.
func ExampleDecode() {
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	_, err = nc.Subscribe("acme.events.>", func(msg *nats.Msg) {
		ev, err := ferrynats.Decode(msg)
		if err != nil {
			log.Printf("skip message on %s: %v", msg.Subject, err)
			return
		}
		log.Printf("%s %s (key %s, seq %d)", ev.Type, ev.ID, ev.Key, ev.Seq)
	})
	if err != nil {
		log.Fatal(err)
	}
}

// consumer stands for the consumer group's *ferry.Consumer, created with
// ferry.NewConsumer.
var consumer interface {
	Ingest(ctx context.Context, events []*ferryevent.Event) (inserted int, err error)
}

// A consumer group reads the stream through its durable consumer and
// records the events in its inbox; Run acknowledges them to JetStream only
// once Ingest has returned nil.
func ExampleSource_Run() {
	ctx := context.Background()
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	src, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{
		Stream:        "ORDERS",
		SubjectPrefix: "acme.events",
		Durable:       "billing", // the consumer group
	})
	if err != nil {
		log.Fatal(err)
	}
	// Run returns nil when ctx ends.
	err = src.Run(ctx, func(ctx context.Context, events []*ferryevent.Event) error {
		_, err := consumer.Ingest(ctx, events)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}
