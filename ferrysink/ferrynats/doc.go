// Package ferrynats connects Ferry to NATS JetStream. Its Sink, for the
// relay, publishes each event as one JetStream message and reports it
// published once the stream has acknowledged it. Its Source, for a consumer
// group, reads those messages back through a durable consumer into the
// group's inbox.
//
// It is its own Go module, so that applications publishing elsewhere do not
// download the NATS client.
//
// # Publishing
//
// The sink never dials: connect with nats.Connect, hand the connection to
// New, and close it after the sink. Pass WriteFence, so that a relay
// paused past its lease writes nothing nats.go had buffered for it.
//
//	nc, err := nats.Connect(os.Getenv("NATS_URL"), ferrynats.WriteFence())
//	if err != nil {
//		return err
//	}
//	defer nc.Close()
//	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{
//		Stream:        "ORDERS",
//		SubjectPrefix: "acme.events", // topic "orders" -> subject "acme.events.orders"
//	})
//	if err != nil {
//		return err
//	}
//	defer sink.Close(ctx)
//
// New checks that the stream exists and captures "<SubjectPrefix>.>". Set
// Config.CreateStream to have it created (file storage, two-minute duplicate
// window), or create it yourself:
//
//	nats stream add ORDERS --subjects 'acme.events.>' --storage file --dupe-window 2m
//
// # Wire format
//
// Events use the binary content mode of the CloudEvents NATS protocol
// binding. The message data is the payload, untouched. Headers:
//
//	Nats-Msg-Id            event ID; JetStream drops a copy published again within
//	                       the stream's duplicate window, which makes relay retries safe
//	Nats-Expected-Stream   Config.Stream; a subject captured by another stream fails
//	ce-specversion         1.0
//	ce-id                  event ID
//	ce-source              Source, or "ferry" when empty
//	ce-type                Type
//	ce-subject             Key
//	ce-time                CreatedAt, RFC 3339 in UTC with nanoseconds
//	ce-datacontenttype     ContentType, when set
//	ce-ferrytopic          Topic
//	ce-ferrykeyseq         Seq, when set; consumers use it to detect gaps
//	Content-Type           ContentType again, when set
//	<name>                 each of the event's Headers, under its own name
//
// Decode (or DecodeJetStream) turns such a message back into an event.
//
// The names above belong to Ferry. A user header whose name equals one of
// them, ignoring case, is not sent: it can never replace the dedup ID, the
// expected stream or an attribute. Any other header is sent as is,
// including other "Nats-" headers, which JetStream interprets: Nats-TTL sets
// a per-message TTL where the stream allows it, and Nats-Rollup purges
// earlier messages where the stream allows rollups, so keep such names out
// of event headers unless that is what you want. Ferry rejects none of
// them, but Decode treats every "Nats-" header as the broker's and leaves it
// out of Event.Headers. A
// header value sent over NATS loses leading and trailing white space, and a
// CR or LF in it becomes a space; a header name must be printable ASCII
// without spaces or any of "()/,:;<=>?@[\]{} (an event with another name
// fails permanently).
//
// # Failures
//
// Publish reports each event's outcome. Retrying cannot fix these, so they
// are ferrysink.PermanentError and the relay dead-letters the event:
//
//   - headers and payload together exceed the server's max_payload (checked
//     before sending) or the stream's max_msg_size;
//   - the subject is invalid, or no stream captures it, or a stream other
//     than Config.Stream does;
//   - a header name NATS cannot carry, or any other JetStream "bad request".
//
// Everything else is retried by the relay: ack timeouts (Config.AckTimeout),
// disconnections, a stream that captures the subject but does not answer
// (during a leader election, say), and a cancelled context.
//
// # Ordering
//
// Publish sends a call's messages asynchronously, up to Config.MaxInFlight
// across the sink, and returns when every one is acknowledged. Messages of
// one call may therefore be stored in any order, which the relay allows: it
// never puts two events of one key in a call, nor publishes a key again
// before the previous outcome is known. The sink does not implement
// ferrysink.OrderedBatcher.
//
// # Consuming
//
// A Source reads the stream through a durable pull consumer, one per
// consumer group, and hands the events to the group's inbox. NewSource
// creates the durable, or updates it: explicit acks, delivery from the
// stream's first message, no delivery limit, the subjects
// "<SubjectPrefix>.>" (or SourceConfig.FilterSubject).
//
//	js, err := jetstream.New(nc)
//	if err != nil {
//		return err
//	}
//	src, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{
//		Stream:        "ORDERS",
//		SubjectPrefix: "acme.events",
//		Durable:       "billing", // the consumer group
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
//   - Nothing is lost. A message is acknowledged to JetStream only after
//     ingest returned nil for its batch, so every event is in the inbox
//     before JetStream forgets it. An event may reach ingest twice (after a
//     restart, or a lost acknowledgement); the inbox keeps one copy.
//   - Order is kept. Events reach ingest in stream order, which is each
//     key's order. A failed ingest stops the line: Run backs off
//     (SourceConfig.RetryBase to RetryMax) and retries the same batch,
//     fetching nothing else, and extends the batch's ack deadline so that
//     JetStream does not deliver it again meanwhile.
//   - Restarts keep the order too. When ctx ends, Run hands back the
//     messages it held, for immediate redelivery. The messages of a crashed
//     process come back only after SourceConfig.AckWait, so a Run that finds
//     messages unacknowledged on its durable waits for them (at most twice
//     AckWait) before ingesting anything newer.
//   - Bad input cannot block the line. A message that is not a Ferry event
//     goes to SourceConfig.OnInvalid (by default, logged) and is terminated:
//     JetStream never delivers it again. The rest of its batch is ingested.
//
// The durable is one ordering line: one Source reads it at a time. Run it
// with ferry.Consumer.Consume, which enforces that across processes: the
// Source names its durable (ReaderName, a ferrysink.SingleReader), and
// Consume holds a lease of that name in the consumer's store while it
// reads; the replicas of a service (or the old and new pods of a rolling
// deploy) stand by and take over within ConsumerConfig.SourceLeaseTTL when
// the reader dies, or at once when it stops. After a crash, the new reader
// waits for the messages the dead one held (SourceConfig.AckWait) before
// ingesting anything newer. Called directly, a second Run on the same
// Source is refused; a Source in another process is not, but Run notices
// deliveries of its durable that went elsewhere, waits for JetStream to
// deliver them again, and logs a warning when they do not come back.
//
// To spread ingestion over a service's replicas, divide the subjects into
// shares: Config.Shares on the sink (the relay's --shares) and the same
// SourceConfig.Shares on the source. A key's events go to
// "<SubjectPrefix>.<share>.<Topic>"; each share is a durable of its own,
// "<Durable>-<share>", and Consume balances the shares over the replicas
// (ferrysink.Shared), one reader per share, a dead replica's shares taken
// over within SourceLeaseTTL.
//
// Stability: this package may change between minor versions until 1.0.
package ferrynats
