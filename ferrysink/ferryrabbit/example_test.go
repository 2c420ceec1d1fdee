package ferryrabbit_test

import (
	"context"
	"log"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
)

// The sink dials RabbitMQ itself and reconnects when the connection is
// lost. The relay normally calls Publish; it is called directly here to
// show the per-event results.
func ExampleNew() {
	ctx := context.Background()
	sink, err := ferryrabbit.New(ctx, &ferryrabbit.Config{
		URL:             os.Getenv("RABBITMQ_URL"), // amqp://user:password@host:5672/vhost
		Exchange:        "acme.events",             // topic "orders" -> routing key "orders"
		DeclareExchange: true,                      // durable topic exchange
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close(ctx)

	ev := &ferryevent.Event{ID: ferryevent.NewID(), Topic: "orders", Key: "order-42", Type: "OrderPlaced", Payload: []byte(`{}`)}
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{ev}) {
		if err != nil {
			log.Print(err) // a ferrysink.PermanentError if no queue is bound for "orders"
		}
	}
}

// A consumer that is not a Ferry inbox reads events with Decode.
func ExampleDecode() {
	conn, err := amqp.Dial(os.Getenv("RABBITMQ_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("audit", "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	for d := range deliveries {
		ev, err := ferryrabbit.Decode(d)
		if err != nil {
			log.Printf("not a Ferry event: %v", err)
			_ = d.Reject(false) // to the queue's dead-letter exchange, if any
			continue
		}
		log.Printf("%s %s (key %s, seq %d)", ev.Type, ev.ID, ev.Key, ev.Seq)
		_ = d.Ack(false)
	}
}

// consumer stands for the consumer group's *ferry.Consumer, created with
// ferry.NewConsumer.
var consumer interface {
	Ingest(ctx context.Context, events []*ferryevent.Event) (inserted int, err error)
}

// A consumer group consumes its own queue, a quorum queue with a single
// active consumer bound to the sink's exchange, and records the events in
// its inbox; Run acknowledges them only once Ingest has returned nil.
func ExampleSource_Run() {
	ctx := context.Background()
	src, err := ferryrabbit.NewSource(ctx, &ferryrabbit.SourceConfig{
		URL:          os.Getenv("RABBITMQ_URL"),
		Queue:        "billing.events", // one queue per consumer group
		DeclareQueue: true,             // quorum, single active consumer
		Exchange:     "acme.events",
		BindingKeys:  []string{"orders", "payments.#"},
		QueueArgs:    amqp.Table{"x-dead-letter-exchange": "acme.dead"}, // where messages that are not Ferry events go
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
