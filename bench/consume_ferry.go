package bench

import (
	"context"
	"fmt"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/jackc/pgx/v5"
)

// inboxBatch is the batched Ferry consumers' ConsumerConfig.BatchSize.
const inboxBatch = 32

// inboxWorkers is every Ferry consumer's ConsumerConfig.Workers.
const inboxWorkers = 8

// ferryInbox is Ferry's idempotent consumer on PostgreSQL: the backlog is
// put in the group's inbox with Consumer.Ingest, and the child runs
// ferry.NewConsumer(...).Run with a handler that upserts in the
// transaction that marks the event processed. batch is BatchSize; batchFn
// registers a batch handler (HandleEventBatch: one multi-row upsert per
// transaction) instead of HandleAll.
type ferryInbox struct {
	prefix  string
	name    string
	batch   int
	batchFn bool
	// feeder ingests the backlog; it never runs.
	feeder *ferry.Consumer[pgx.Tx]
}

func (f *ferryInbox) Name() string { return f.name }

func (f *ferryInbox) Describe() string {
	s := fmt.Sprintf("ferrypg inbox, ferry.NewConsumer with Workers %d, BatchSize %d, other ConsumerConfig defaults; ", inboxWorkers, f.batch)
	switch {
	case f.batchFn:
		s += fmt.Sprintf("HandleEventBatch: one multi-row upsert (unnest) per call, each call one event per key; up to %d events per transaction, runs of %d of a key's events, a call per round of the batch (its keys' first events, then their second...), each in a savepoint", f.batch, max(1, f.batch/8))
	case f.batch > 1:
		s += fmt.Sprintf("HandleAll: one upsert per event, up to %d events per transaction (runs of up to %d of a key's events, in order), each in a savepoint", f.batch, f.batch)
	default:
		s += "HandleAll: one upsert per event, one event per transaction (a worker claims a run of up to 32 of a key's events and commits each alone)"
	}
	return s + "; backlog put in the inbox with Consumer.Ingest, 1,000 events per call"
}

func (f *ferryInbox) OrderedPerKey() bool { return true }

func (f *ferryInbox) schema() string { return schemaName(f.prefix, "consume_"+f.name) }

func (f *ferryInbox) keep() []string { return []string{"migrations", "settings"} }

func (f *ferryInbox) Setup(ctx context.Context, e *env) error {
	if err := freshSchema(ctx, e.pool, f.schema()); err != nil {
		return err
	}
	drv, err := ferrypg.New(e.pool, &ferrypg.Config{Schema: f.schema()})
	if err != nil {
		return err
	}
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		return err
	}
	if f.feeder, err = ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: consumeGroup, Logger: quietLogger()}); err != nil {
		return err
	}
	return createProjection(ctx, e, f.schema())
}

// Preload ingests 1,000 events per call from 4 goroutines, keys
// partitioned among them, as a source would after reading a broker.
func (f *ferryInbox) Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error {
	return parallelPreload(events, 4, 1000, func(batch []Meta) error {
		evs := make([]*ferry.Event, len(batch))
		for i, m := range batch {
			evs[i] = ferryEvent(EventID(nonce, m.G), m.Key, EncodePayload(m))
			evs[i].Seq = m.Seq
		}
		n, err := f.feeder.Ingest(ctx, evs)
		if err == nil && n != len(evs) {
			err = fmt.Errorf("ingested %d of %d events", n, len(evs))
		}
		return err
	})
}

// Child side.

func ferryInboxConsumer(ctx context.Context, c *childConfig, batch int, batchFn bool) (runFunc, func(), error) {
	rec := newApplyRecorder()
	pool, err := c.openTracedPool(ctx, inboxWorkers+4, rec)
	if err != nil {
		return nil, nil, err
	}
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: c.schema})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	cons, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: consumeGroup, Workers: inboxWorkers, BatchSize: batch, Logger: c.logger()})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	table := projectionTable(c.schema)
	if batchFn {
		cons.HandleEventBatch(eventType, func(ctx context.Context, tx pgx.Tx, evs []*ferry.Event) error {
			customers, seqs := make([]string, len(evs)), make([]int64, len(evs))
			for i, ev := range evs {
				m, err := DecodePayload(ev.Payload)
				if err != nil {
					return ferry.GiveUp(err)
				}
				customers[i], seqs[i] = KeyString(m.Key), m.Seq
			}
			return applyEvents(ctx, tx, rec, table, customers, seqs)
		})
	} else {
		cons.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
			return applyOne(ctx, tx, rec, table, ev.Payload)
		})
	}
	run := func(ctx context.Context) error {
		err := cons.Run(ctx)
		if werr := rec.write(c.stats); err == nil {
			err = werr
		}
		return err
	}
	return run, pool.Close, nil
}
