// Package ferryrabbit connects Ferry to RabbitMQ. Its Sink, for the relay,
// publishes each event as one persistent message to an exchange and reports
// it published once RabbitMQ has confirmed it. Its Source, for a consumer
// group, consumes those messages from a queue into the group's inbox.
//
// It is its own Go module, so that applications publishing elsewhere do not
// download the AMQP client (github.com/rabbitmq/amqp091-go). It speaks AMQP
// 0-9-1; its tests run against RabbitMQ 3.10.
//
// # Publishing
//
// New dials the broker, checks the exchange (or declares it with
// Config.DeclareExchange) and opens a channel in publisher confirm mode:
//
//	sink, err := ferryrabbit.New(ctx, &ferryrabbit.Config{
//		URL:             "amqps://relay:secret@rabbit.internal:5671/prod",
//		Exchange:        "acme.events", // durable topic exchange
//		DeclareExchange: true,
//	})
//	if err != nil {
//		return err
//	}
//	defer sink.Close(ctx)
//
// Each event goes to Config.Exchange with its Topic as routing key (or
// Config.RoutingKey's), as a persistent message published mandatory. Bind
// each consumer group's queue to the exchange with the routing keys it
// wants ("orders", "payments.#", "#").
//
// The sink sends the messages of a Publish call back to back and tracks
// their confirms by delivery tag, at most Config.MaxInFlight unconfirmed
// across the sink. When the connection or the channel is lost it fails the
// events awaiting a confirm with retryable errors and opens a new channel,
// or connection, for the next events; it never replays on its own, the
// relay does. Close waits for the confirms of the messages in flight.
//
// # Wire format
//
// Events use the binary content mode of the CloudEvents AMQP protocol
// binding. The binding maps attributes to AMQP 1.0 application properties,
// which RabbitMQ carries as the headers table of AMQP 0-9-1 (and shows as
// application properties to AMQP 1.0 clients). Of the binding's two
// prefixes, "cloudEvents_" and "cloudEvents:", the sink writes the one the
// binding prefers, "cloudEvents_", which JMS clients and selectors accept;
// Decode reads either. The message body is the payload, untouched.
//
//	message-id                event ID
//	content-type              ContentType (the datacontenttype attribute), when set
//	timestamp                 CreatedAt, in whole seconds
//	delivery-mode             2 (persistent)
//	cloudEvents_specversion   1.0
//	cloudEvents_id            event ID
//	cloudEvents_source        Source, or "ferry" when empty
//	cloudEvents_type          Type
//	cloudEvents_subject       Key
//	cloudEvents_time          CreatedAt, RFC 3339 in UTC with nanoseconds
//	cloudEvents_ferrytopic    Topic
//	cloudEvents_ferrykeyseq   Seq, when set; consumers use it to detect gaps
//	<name>                    each of the event's Headers, under its own name
//
// The attribute values are strings. Decode also accepts the native AMQP
// types the binding allows (a timestamp for time, an integer for
// ferrykeyseq), so events from other CloudEvents producers decode too.
//
// The cloudEvents_ names above belong to Ferry: a user header whose name
// equals one of them, ignoring case and with either prefix, is not sent.
// Any other header is sent as is, as a string. Decode leaves the headers
// RabbitMQ adds (x-death, x-first-death-*, x-last-death-*, x-delivery-count,
// x-received-from) out of Event.Headers.
//
// # Failures
//
// Publish reports each event's outcome. Retrying cannot fix these, so they
// are ferrysink.PermanentError and the relay dead-letters the event:
//
//   - Unroutable: RabbitMQ returned the message (basic.return, 312
//     NO_ROUTE) because no queue is bound for its routing key. The reason
//     names the routing key and the exchange. An exchange with an
//     alternate exchange never returns messages: they go there instead.
//   - Too large: the payload is over Config.MaxMessageBytes, checked before
//     sending. It defaults to RabbitMQ's default max_message_size for the
//     broker's version: 128 MiB before RabbitMQ 4.0, 16 MiB from 4.0. If the
//     broker's limit is lower, RabbitMQ closes the channel over the message;
//     the sink then fails that event permanently, the others in flight on the
//     channel with retryable errors, and applies the broker's limit from
//     then on.
//   - Not expressible in AMQP 0-9-1: a routing key, header name or content
//     type longer than 255 bytes, or headers that do not fit in one frame of
//     the connection (frame_max, 128 KiB by default).
//
// Everything else is retried by the relay: a nack (RabbitMQ could not store
// the message, or a full queue with overflow reject-publish refused it), a
// lost connection or channel (including one RabbitMQ closed because the
// exchange was deleted or the user lacks permission; the error says which),
// a connection blocked by a memory or disk alarm, no confirm within
// Config.ConfirmTimeout, and a cancelled context. An event that failed
// after it was sent may have been stored: its copy arrives before the
// key's next event, and consumers deduplicate by ID.
//
// # Ordering
//
// Messages of one call may be stored in any order, which the relay allows:
// it never puts two events of one key in a call, nor publishes a key again
// before the previous outcome is known. The sink does not implement
// ferrysink.OrderedBatcher. RabbitMQ keeps the order in which one channel
// publishes to a queue, so each key's events reach every bound queue in
// order.
//
// # Consuming
//
// A Source consumes one queue per consumer group and hands the events to
// the group's inbox. Use quorum queues (x-queue-type: quorum): they are
// replicated and durable. Declare the queue with x-single-active-consumer:
// true, so that one Source consumes it and others wait on standby; without
// it, RabbitMQ spreads the messages of a queue over its consumers, which
// breaks per-key order. Run does not ask for an exclusive consumer instead:
// classic queues refuse one on a single-active-consumer queue, and RabbitMQ
// 3.10 does not enforce it on quorum queues. NewSource with
// SourceConfig.DeclareQueue declares such a queue, durable, and binds it:
//
//	src, err := ferryrabbit.NewSource(ctx, &ferryrabbit.SourceConfig{
//		URL:          "amqps://billing:secret@rabbit.internal:5671/prod",
//		Queue:        "billing.events",
//		DeclareQueue: true, // quorum, single active consumer
//		Exchange:     "acme.events",
//		BindingKeys:  []string{"orders", "payments.#"},
//		QueueArgs:    amqp.Table{"x-dead-letter-exchange": "acme.dead"},
//	})
//	if err != nil {
//		return err
//	}
//	// Run returns nil when ctx ends.
//	return src.Run(ctx, func(ctx context.Context, events []*ferryevent.Event) error {
//		_, err := consumer.Ingest(ctx, events) // consumer is the group's *ferry.Consumer
//		return err
//	})
//
// What Run guarantees:
//
//   - Nothing is lost. The channel's prefetch count is SourceConfig.Batch,
//     acknowledgements are manual, and a batch is acknowledged (one multiple
//     ack up to its last message) only after ingest returned nil for it.
//     An event may reach ingest twice (after a lost connection or a
//     restart); the inbox keeps one copy.
//   - Order is kept. With one active consumer RabbitMQ delivers a queue in
//     order. A failed ingest stops the line: Run keeps the batch delivered
//     and unacknowledged, backs off (SourceConfig.RetryBase to RetryMax) and
//     hands ingest the same batch again, ingesting nothing later meanwhile.
//     It never nacks with requeue, so the retries cost no redeliveries.
//   - Restarts and lost connections keep the order too. When the channel
//     closes, RabbitMQ requeues its unacknowledged messages ahead of the
//     messages never delivered: a classic queue puts them back at their
//     original position, a quorum queue returns them before its other
//     messages. The next consumer receives them first, flagged redelivered.
//   - Bad input cannot block the line. A message that is not a Ferry event
//     goes to SourceConfig.OnInvalid (by default, logged) and is rejected
//     without requeueing: the queue's dead-letter exchange
//     (x-dead-letter-exchange) receives it, or RabbitMQ drops it if there is
//     none. The rest of its batch is ingested.
//
// Two broker settings bound the retries of a batch. RabbitMQ closes a
// channel that holds a message unacknowledged longer than consumer_timeout
// (30 minutes by default); Run then reconnects and receives the batch again,
// in order. Quorum queues on RabbitMQ 4.0 and later dead-letter, or drop, a
// message returned to the queue more than delivery-limit times (20 by
// default); depending on the version, returns caused by restarts or lost
// connections while a batch was held count towards it: give the queue a
// dead-letter exchange.
//
// A nack from the broker to the sink and a return are described under
// Failures; a source never nacks a Ferry event.
//
// Stability: this package may change between minor versions until 1.0.
package ferryrabbit
