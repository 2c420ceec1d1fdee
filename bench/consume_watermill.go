package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// watermillSubBatch is the subscriber's SubscribeBatchSize (watermill-sql's
// default).
const watermillSubBatch = 100

// watermillSub is a watermill-sql subscriber as an exactly-once consumer:
// the handler takes the subscriber's own transaction from the message's
// context (wsql.TxFromContext) and upserts in it; the subscriber commits
// it, with the consumer group's new offset, once every message of the
// batch it read was acknowledged.
type watermillSub struct {
	prefix string
}

func (w *watermillSub) Name() string { return "watermill-subscriber" }

func (w *watermillSub) Describe() string {
	return fmt.Sprintf("watermill v1.5.1 + watermill-sql/v4 v4.1.2 Subscriber (DefaultPostgreSQLSchema, SubscribeBatchSize %d, DefaultPostgreSQLOffsetsAdapter, PollInterval 10 ms, other settings default), one subscriber for the consumer group reading its channel; the handler upserts in the subscriber's transaction (wsql.TxFromContext(msg.Context())) and acks, and the subscriber commits that REPEATABLE READ transaction with the group's offset after the batch's last ack, so a transaction holds up to %d events, applied one at a time; backlog written with a watermill-sql Publisher, 1,000 messages per Publish",
		watermillSubBatch, watermillSubBatch)
}

func (w *watermillSub) OrderedPerKey() bool { return true }

func (w *watermillSub) schema() string { return schemaName(w.prefix, "consume_"+w.Name()) }

func (w *watermillSub) keep() []string { return nil }

func (w *watermillSub) Setup(ctx context.Context, e *env) error {
	if err := freshSchema(ctx, e.pool, w.schema()); err != nil {
		return err
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(e.pool), wsql.SubscriberConfig{
		ConsumerGroup:    consumeGroup,
		SchemaAdapter:    watermillSchemaAdapter(w.schema(), watermillSubBatch),
		OffsetsAdapter:   watermillOffsetsAdapter(w.schema()),
		InitializeSchema: true,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	if err := sub.SubscribeInitialize(Topic); err != nil {
		return fmt.Errorf("watermill: initialize schema: %w", err)
	}
	_ = sub.Close()
	return createProjection(ctx, e, w.schema())
}

// Preload publishes 1,000 messages per Publish call (one multi-row INSERT)
// on the pool from 4 goroutines, keys partitioned among them.
func (w *watermillSub) Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error {
	pub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(e.pool), wsql.PublisherConfig{SchemaAdapter: watermillSchemaAdapter(w.schema(), watermillSubBatch)}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	return parallelPreload(events, 4, 1000, func(batch []Meta) error {
		msgs := make([]*message.Message, len(batch))
		for i, m := range batch {
			msgs[i] = watermillMessage(ctx, EventID(nonce, m.G), m.Key, EncodePayload(m))
		}
		return pub.Publish(Topic, msgs...)
	})
}

// Child side.

func watermillSubConsumer(ctx context.Context, c *childConfig) (runFunc, func(), error) {
	rec := newApplyRecorder()
	pool, err := c.openTracedPool(ctx, 4, rec)
	if err != nil {
		return nil, nil, err
	}
	logger := watermill.NewSlogLogger(c.logger())
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		ConsumerGroup:  consumeGroup,
		PollInterval:   10 * time.Millisecond,
		SchemaAdapter:  watermillSchemaAdapter(c.schema, watermillSubBatch),
		OffsetsAdapter: watermillOffsetsAdapter(c.schema),
	}, logger)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	table := projectionTable(c.schema)
	apply := func(msg *message.Message) error {
		tx, ok := wsql.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no subscriber transaction in the message's context")
		}
		ptx, ok := tx.(*wsql.PgxTx)
		if !ok {
			return fmt.Errorf("subscriber transaction is a %T, not a *sql.PgxTx", tx)
		}
		return applyOne(msg.Context(), ptx.Tx, rec, table, msg.Payload)
	}
	log := c.logger()
	run := func(ctx context.Context) error {
		msgs, err := sub.Subscribe(ctx, Topic)
		if err != nil {
			return err
		}
		for msg := range msgs {
			if err := apply(msg); err != nil {
				log.Warn("watermill-subscriber: apply failed", "err", err)
				msg.Nack()
				continue
			}
			msg.Ack()
		}
		return rec.write(c.stats)
	}
	return run, func() { _ = sub.Close(); pool.Close() }, nil
}
