/*
Package ferry moves events from a Go service's database to the rest of the
system with nothing lost, nothing published for a rolled-back transaction,
nothing applied twice and, per key, nothing out of order: the transactional
outbox, its relay and the idempotent consumer.

This is the API reference, with the main calls in order. The guide (getting
started per database and broker, concepts, operating, troubleshooting) is
in the repository's docs/ directory:
https://github.com/ferry-dev/ferry/tree/main/docs.

# Emitting events

Write events in the same transaction as the business data they describe.
If the transaction rolls back, so do the events:

	drv, err := ferrypg.New(pool, nil) // pool is your *pgxpool.Pool
	client, err := ferry.NewClient(drv, nil)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", id, total); err != nil {
			return err
		}
		return client.EmitTx(ctx, tx, &ferry.Event{
			Topic:   "orders",
			Key:     id,              // events of one key stay in order
			Type:    "OrderPlaced",
			Payload: payload,
		})
	})

EmitTx validates events before writing anything and returns a
*ValidationError naming the event, the field and the rule. The rule
(ferryevent.Validate) is that every field of an accepted event reaches every
sink and consumer byte for byte: topics are dot-separated words of ASCII
letters, digits, '-' and '_'; keys, types, sources, content types and header
values are UTF-8 without control characters or surrounding white space, within
the ferryevent.Max*Bytes limits; header names are HTTP tokens and not reserved
(ferryevent.ReservedHeader); the payload plus its envelope fits
Config.MaxPayloadBytes. Event IDs are UUIDv7s filled in when empty; mint
them yourself with NewID before a transaction you may retry, so that every
attempt emits the same event.

database/sql users pass a *sql.Tx to a driver made by ferrypg.NewSQL. An
embedded SQLite database works the same way with ferrysqlite.Open; begin
transactions on its DB() handle and pass the *sql.Tx.

# Transactions that retry, and idempotent requests

RunTx runs a callback in a transaction and runs it again when the database
says it lost a race (a serialization failure, a deadlock), never when a
commit's answer was lost: that is resolved by asking the database, or the
request record. With TxOptions.RequestID the result is stored in the same
transaction, and a resend returns it:

	res, err := ferry.RunTx(ctx, drv, &ferry.TxOptions{RequestID: reqID, Input: in},
		func(ctx context.Context, tx pgx.Tx) (Result, error) {
			id := ferry.StableID(ctx, "order") // the same on every attempt
			...
			return Result{ID: id}, client.EmitTx(ctx, tx, ev)
		})

The callback must have no effect outside the transaction: emit an event and
act on it in a consumer.

# Relaying

A Relay tails the outbox in commit order and publishes to a sink: NATS
JetStream (ferrynats), Kafka (ferrykafka), RabbitMQ (ferryrabbit), HTTP
webhooks (ferrywebhook), or a consumer group's inbox in the same database
(Consumer.Sink):

	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{CreateStream: true})
	relay, err := ferry.NewRelay(drv, sink, nil)
	err = relay.Run(ctx) // until ctx is cancelled

Run it inside your service or as the `ferry relay` daemon. Several relays
may run for one outbox: one leads, fenced by a lease with a term, and the
others take over within RelayConfig.LeaseTTL if it dies. A relay that was
paused past its lease (a GC pause, SIGSTOP, a VM migration) cannot write a
checkpoint when it wakes up.

The outbox can be split by key hash into partitions, one relay each
(RelayConfig.Partition). The count is stored with the schema when it is
migrated and changed with `ferry partitions set N` once the relays have
delivered everything and stopped; a driver configured with Partitions 0
(the default) follows it, and a producer or relay configured with another
count is refused with an error wrapping ErrMisconfigured instead of
splitting a key's events across partitions.

# Consuming

A Consumer applies its group's events with exactly-once effect: each
handler runs in a transaction of the consumer's database in which the event
is also marked processed.

	billing, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing"})
	ferry.Handle(billing, "OrderPaid", func(ctx context.Context, tx pgx.Tx, ev *ferry.Event, o OrderPaid) error {
		_, err := tx.Exec(ctx, "INSERT INTO invoices (order_id, total) VALUES ($1, $2)", o.ID, o.Total)
		return err
	})
	err = billing.Run(ctx) // until ctx is cancelled

Relay, Consumer, Balancer and the broker sources share one lifecycle: Run
blocks until ctx ends, then stops within its ShutdownTimeout and returns
nil; it returns early with an error only for a problem retrying cannot fix
(ErrSchemaMissing, ErrMisconfigured, a broker consumer that was deleted),
and retries outages itself. Run them side by side in an errgroup. When a
consumer stops, running handlers may finish until the last quarter of
ConsumerConfig.ShutdownTimeout (10 s) begins; then their contexts are
cancelled, their transactions roll back and the events run again later.

Events reach the group's inbox from a source: the outbox of the same
database (a Relay into Consumer.Sink), or a broker subscription calling
Consumer.Ingest. Keys run in parallel, each key in order; failures retry
with backoff, then go DEAD (ConsumerConfig.OnDead, DeadPolicy). A crash
costs an attempt too: the events a claim covered when it expired (their
process crashed, or a handler outlived ConsumerConfig.ClaimTTL) count one
each and run again with nothing else running, in groups that halve with
each crash (Workers at first) and alone on an event's last attempt, so the
event that crashes its process goes DEAD after MaxAttempts crashes, and no
other event goes DEAD for it. A process that dies stops renewing its
membership of the group (ConsumerConfig.LivenessTTL, 5 s), and the group's
other processes then end its claims at once instead of after ClaimTTL.
Consumer.Consume reads a source that must
have one reader at a time (a JetStream durable) from one process of the
group, under a lease (ConsumerConfig.SourceLeaseTTL); the others stand by
and take over when it dies. A source divided into shares (ferrysink.Shared:
ferrynats.SourceConfig.Shares) is read by all of them, the shares balanced
over the processes as a Balancer balances partitions, one reader per
share. An event of a type
without a handler fails, naming its type, unless HandleAll handles it or
ConsumerConfig.SkipUnhandled skips it. Register handlers before Run. The
group's dead policy is stored when Run starts and is the one every process
of the group follows.

A worker claims a run of a key's next events at once (one claim on the
key, not one per event). By default a transaction applies up to 32 claimed
events (ConsumerConfig.BatchSize; 1 for one per transaction): runs of one
or more keys, each key's in order, so that a failing handler is rolled
back alone and recorded as its event's failed attempt while the others
commit; the key's later events in the batch then wait behind it. A batch
first runs with no savepoint, and when a handler fails it rolls back and
runs again with a savepoint per handler, the failing event recorded with
the error it gave and the handlers before it called again
(ConsumerConfig.SavepointEach takes a savepoint per handler from the
start). HandleBatch registers a handler that gets a
batch's events of its type in one call, one event per key per call (a
batch runs in rounds: the first event of each key, then the second...),
for multi-row statements; when the call fails it runs again for each
event alone. While an event is claimed, InboxStates reads it as
PROCESSING, and so does the rest of its run.

AwaitSettled tells a request path whether a group has settled events,
failed them (and why) or not yet, woken by the database rather than
polling, and on a connection of its own, so a caller's transaction snapshot
cannot hide the consumer's commit. Failed is the cheap gate predicate.

# Typed events

NewEvent builds an event from a typed message with its codec, and Handle
decodes it back into the handler's type: JSON by default, Protocol Buffers
for a proto.Message once package ferryproto's codec is registered
(RegisterCodec(ferryproto.Codec{})). The event carries the codec's content
type, and a handler whose type another codec decodes sends the event DEAD
with a reason that names both (Decode).

	ev, err := ferry.NewEvent("orders", id, "OrderPlaced", &orderspb.OrderPlaced{Id: id, Total: total})
	err = client.EmitTx(ctx, tx, ev)

# Testing a service

Package ferrytest asserts on what a transaction emitted (RequireEmittedTx),
runs a group's handlers on events a test delivers with the inbox's
semantics (NewConsumer), and drains the outbox into an in-memory sink with
a real relay (Drain), so that a service's tests need no broker.

# Guarantees

  - An event is published if and only if its transaction committed.
  - Every committed event is published at least once, across relay
    crashes, database restarts and broker outages. The checkpoint never
    passes an event the sink has not acknowledged. A crash republishes at
    most two batches (plus the head event of each parked key); JetStream
    drops those copies by Nats-Msg-Id.
  - Events with the same key are published in the commit order of their
    transactions (and in call order within one), also across publish
    retries. Other keys never wait for each other: in the relay every key
    is a queue of its own, and a key whose destination hangs or keeps
    failing while others are acknowledged is parked after StallTimeout:
    its events are set aside in the database and published from there, in
    order, once it recovers (DeadPolicy decides after MaxAttempts or
    MaxAge). Consumers run keys independently too.
  - A long transaction elsewhere in the database does not hold delivery
    back, nor does a transaction that took its id early and commits late
    get skipped.
  - An event the broker rejects for good (too large, unroutable) goes to
    the relay's dead-letter table with the reason; `ferry dlq list` shows it
    and `ferry dlq redrive` sends it back, with the same event ID and Seq,
    to the feed that dead-lettered it and to no other, which publishes it
    after what it had published of its key (RedriveDeadLetters).
    Dead letters are kept for RelayConfig.DeadLetterRetention (14 days).

# Operating

The ferry command runs the relay (`ferry relay`), creates the schema
(`ferry migrate up`, or `ferry migrate sql` for your own migration tool) and
reports checkpoint, lag, lease and dead letters (`ferry status`; the lag
beyond 1,000 events is an estimate, `--exact` counts), and shows or changes
the partition count (`ferry partitions show|set`). The relay exports
metrics through its hooks (ferryprom.New(registerer) for Prometheus, in
RelayConfig.Hooks) and logs with log/slog. Its
periodic work costs the same however long the backlog and the history: the
heartbeat estimates the lag (Store.FeedLag), and the retention pass removes
published events and expired dead letters in bounded chunks.

# Tracing and telemetry

Hooks observe the runtime without the root module depending on a telemetry
stack. Their interfaces are in package ferryhook; a hook is any value, and
the runtime calls, on each hook it is given, the methods of the interfaces
it implements:

  - ferryhook.EmitHook (Config.Hooks): each event at emit, before
    validation, where a tracer writes the caller's trace context into the
    headers.
  - ferryhook.PublishHook (RelayConfig.Hooks): each event the relay
    published, with the sink's answer and its system (ferrysink.Describer).
  - ferryhook.IngestHook (ConsumerConfig.Hooks): each delivery put in the
    inbox, with the transport it came through (IngestInfo.System: a
    source's ferrysink.Describer, read by Consume, or ferrysink.WithSystem
    in the context of Ingest; "ferry" for Consumer.Sink and when none is
    named).
  - ferryhook.TxHook (TxOptions.Hooks): each RunTx call, its retries and
    its end.
  - SettleHook (AwaitSettled's trailing hooks): each wait, its start and
    its outcome.
  - ferryhook.MetricsHook (any of the above): an Instrument per documented
    metric (MetricDesc), made when a relay or consumer is made and on each
    RunTx and AwaitSettled call.

ConsumerConfig.Middleware wraps every handler call, batch calls included,
for tracing, logging, metrics or code of your own (ConsumerGroup names the
group), and EventFromContext gives a log handler the event a record is
about. Package ferryotel (its own module) implements the hooks and a
middleware for OpenTelemetry, one trace from the request that emitted an
event to every handler that applied it, and package ferryprom a
MetricsHook for Prometheus:

	prom, tr := ferryprom.New(prometheus.DefaultRegisterer), ferryotel.New()
	consumer, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing",
		Hooks: []ferryhook.Hook{prom, tr}, Middleware: []ferry.Middleware{tr.Middleware()}})
	st, err := ferry.AwaitSettled(ctx, drv, "billing", ids, 2*time.Second, prom, tr) // the metric and the span
*/
package ferry
