package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// watermillConfig is a watermill-sql subscriber configuration.
type watermillConfig struct {
	name         string
	pollInterval time.Duration
	batch        int
}

var (
	// watermillStock is watermill-sql's defaults: PollInterval 1 s,
	// SubscribeBatchSize 100.
	watermillStock = watermillConfig{name: "watermill", pollInterval: time.Second, batch: 100}
	// watermillTuned polls every 10 ms and reads 1,000 rows at a time.
	watermillTuned = watermillConfig{name: "watermill-tuned", pollInterval: 10 * time.Millisecond, batch: 1000}
)

// forwarderTopic is the SQL topic the forwarder reads (table watermill_outbox).
const forwarderTopic = "outbox"

// watermillC is Watermill's outbox: the producer writes, inside its own
// transaction, through forwarder.NewPublisher(wsql.NewPublisher(tx)) into
// the SQL table; the relay is forwarder.NewForwarder over a watermill-sql
// subscriber (DefaultPostgreSQLSchema: xid8-ordered reads, and
// DefaultPostgreSQLOffsetsAdapter), publishing through a message.Publisher
// over the shared ferrynats sink.
type watermillC struct {
	prefix string
	cfg    watermillConfig
}

func (w *watermillC) Name() string { return w.cfg.name }

func (w *watermillC) Describe() string {
	return fmt.Sprintf("watermill v1.5.1 + watermill-sql/v4 v4.1.2, forwarder; DefaultPostgreSQLSchema (JSON payload column) with SubscribeBatchSize %d, DefaultPostgreSQLOffsetsAdapter, PollInterval %s, other settings default",
		w.cfg.batch, w.cfg.pollInterval)
}

func (w *watermillC) OrderedPerKey() bool { return true }

func (w *watermillC) schema() string { return schemaName(w.prefix, w.Name()) }

func watermillSchemaAdapter(schema string, batch int) wsql.DefaultPostgreSQLSchema {
	return wsql.DefaultPostgreSQLSchema{
		SubscribeBatchSize: batch,
		GenerateMessagesTableName: func(topic string) string {
			return schema + `."watermill_` + topic + `"`
		},
	}
}

func watermillOffsetsAdapter(schema string) wsql.DefaultPostgreSQLOffsetsAdapter {
	return wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return schema + `."watermill_offsets_` + topic + `"`
		},
	}
}

func (w *watermillC) Setup(ctx context.Context, e *env) error {
	if err := freshSchema(ctx, e.pool, w.schema()); err != nil {
		return err
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(e.pool), wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		SchemaAdapter:    watermillSchemaAdapter(w.schema(), w.cfg.batch),
		OffsetsAdapter:   watermillOffsetsAdapter(w.schema()),
		InitializeSchema: true,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	if err := sub.SubscribeInitialize(forwarderTopic); err != nil {
		return fmt.Errorf("watermill: initialize schema: %w", err)
	}
	_ = sub.Close()
	return createAccounts(ctx, e.pool, w.schema())
}

func (w *watermillC) Reset(ctx context.Context, e *env, checkpoint bool) error {
	return resetPG(ctx, e, w.schema(), nil, checkpoint)
}

func watermillMessage(ctx context.Context, id uuid.UUID, key int, payload []byte) *message.Message {
	msg := message.NewMessage(id.String(), payload)
	msg.Metadata.Set("key", KeyString(key))
	msg.SetContext(ctx)
	return msg
}

// Producer creates, per transaction, a watermill-sql publisher on the
// transaction wrapped in a forwarder publisher, as Watermill's outbox
// documentation does.
func (w *watermillC) Producer(ctx context.Context, e *env, async bool) (producer, error) {
	sa := watermillSchemaAdapter(w.schema(), w.cfg.batch)
	return newPGProducer(e, async, w.schema(), func(ctx context.Context, tx pgx.Tx, id uuid.UUID, key int, payload []byte) error {
		sqlPub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: sa}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic})
		return pub.Publish(Topic, watermillMessage(ctx, id, key, payload))
	}), nil
}

// Preload publishes 1,000 messages per Publish call (one multi-row INSERT)
// on the pool from 4 goroutines, keys partitioned among them.
func (w *watermillC) Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error {
	sqlPub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(e.pool), wsql.PublisherConfig{SchemaAdapter: watermillSchemaAdapter(w.schema(), w.cfg.batch)}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic})
	return parallelPreload(events, 4, 1000, func(batch []Meta) error {
		msgs := make([]*message.Message, len(batch))
		for i, m := range batch {
			msgs[i] = watermillMessage(ctx, EventID(nonce, m.G), m.Key, EncodePayload(m))
		}
		return pub.Publish(Topic, msgs...)
	})
}

func (w *watermillC) Analyze(ctx context.Context, e *env) error {
	return analyzeSchema(ctx, e, w.schema())
}

func (w *watermillC) RelayArgs(e *env) []string { return []string{"--schema", w.schema()} }

func (w *watermillC) Teardown(ctx context.Context, e *env) error {
	_, err := e.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+w.schema()+` CASCADE`)
	return err
}

// sinkPublisher is a Watermill message.Publisher over the shared ferrynats
// sink: the same asynchronous JetStream publishing (window 256, message-ID
// deduplication) every contender uses. It returns once JetStream has
// acknowledged every message of the call.
type sinkPublisher struct {
	sink *ferrynats.Sink
}

func (p *sinkPublisher) Publish(topic string, messages ...*message.Message) error {
	if len(messages) == 0 {
		return nil
	}
	evs := make([]*ferryevent.Event, len(messages))
	for i, m := range messages {
		id, err := uuid.Parse(m.UUID)
		if err != nil {
			id = uuid.NewSHA1(uuid.NameSpaceOID, []byte(m.UUID))
		}
		key := m.Metadata.Get("key")
		if key == "" {
			key = "none"
		}
		evs[i] = &ferryevent.Event{ID: id, Topic: topic, Key: key, Type: eventType, Payload: m.Payload}
	}
	return errors.Join(p.sink.Publish(messages[0].Context(), evs)...)
}

func (p *sinkPublisher) Close() error { return nil }

// Relay side.

func watermillRelay(ctx context.Context, c *childConfig, cfg watermillConfig, sink *ferrynats.Sink) (runFunc, func(), error) {
	pool, err := c.openPool(ctx, 4)
	if err != nil {
		return nil, nil, err
	}
	logger := watermill.NewSlogLogger(c.logger())
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		PollInterval:     cfg.pollInterval,
		SchemaAdapter:    watermillSchemaAdapter(c.schema, cfg.batch),
		OffsetsAdapter:   watermillOffsetsAdapter(c.schema),
		InitializeSchema: true,
	}, logger)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	fwd, err := forwarder.NewForwarder(sub, &sinkPublisher{sink: sink}, logger, forwarder.Config{ForwarderTopic: forwarderTopic})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	run := func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() { _ = fwd.Close() })
		defer stop()
		return fwd.Run(ctx)
	}
	return run, func() { _ = sub.Close(); pool.Close() }, nil
}
