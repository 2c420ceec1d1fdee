package bench

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// riverConfig is a River client configuration.
type riverConfig struct {
	name              string
	fetchCooldown     time.Duration
	fetchPollInterval time.Duration
	maxWorkers        int
}

var (
	// riverDefault is River's defaults (FetchCooldown 100 ms,
	// FetchPollInterval 1 s) with 100 workers.
	riverDefault = riverConfig{name: "river", fetchCooldown: river.FetchCooldownDefault, fetchPollInterval: river.FetchPollIntervalDefault, maxWorkers: 100}
	// riverTuned is riverbench's settings (FetchCooldown 2 ms,
	// FetchPollInterval 20 ms) with 500 workers instead of 2,000, which is
	// oversized for 2 cores.
	riverTuned = riverConfig{name: "river-tuned", fetchCooldown: 2 * time.Millisecond, fetchPollInterval: 20 * time.Millisecond, maxWorkers: 500}
)

// outboxArgs is the job a River producer inserts: one event to publish.
type outboxArgs struct {
	ID      uuid.UUID `json:"id"`
	Key     int       `json:"key"`
	Payload []byte    `json:"payload"`
}

func (outboxArgs) Kind() string { return "ferrybench_outbox" }

// publishWorker publishes a job's event through the shared sink and
// succeeds once JetStream acknowledged it.
type publishWorker struct {
	river.WorkerDefaults[outboxArgs]
	sink *ferrynats.Sink
}

func (w *publishWorker) Work(ctx context.Context, job *river.Job[outboxArgs]) error {
	if w.sink == nil {
		return fmt.Errorf("this process only inserts jobs")
	}
	ev := ferryEvent(job.Args.ID, job.Args.Key, job.Args.Payload)
	return w.sink.Publish(ctx, []*ferryevent.Event{ev})[0]
}

func riverWorkers(sink *ferrynats.Sink) *river.Workers {
	ws := river.NewWorkers()
	river.AddWorker(ws, &publishWorker{sink: sink})
	return ws
}

// riverC is River used as a transactional enqueue: the producer calls
// Client.InsertTx in its transaction, and the relay is a River client whose
// worker publishes the job's event. River is a job queue, not an ordered
// outbox: it fetches with FOR UPDATE SKIP LOCKED across concurrent workers,
// so its per-key order inversions are reported, not scored.
type riverC struct {
	prefix string
	cfg    riverConfig
	client *river.Client[pgx.Tx]
}

func (r *riverC) Name() string { return r.cfg.name }

func (r *riverC) Describe() string {
	return fmt.Sprintf("river v0.51.2 (riverpgxv5), InsertTx per event; MaxWorkers %d, FetchCooldown %s, FetchPollInterval %s, other settings default",
		r.cfg.maxWorkers, r.cfg.fetchCooldown, r.cfg.fetchPollInterval)
}

func (r *riverC) OrderedPerKey() bool { return false }

func (r *riverC) schema() string { return schemaName(r.prefix, r.Name()) }

func quietLogger() *slog.Logger {
	return slog.New(slog.DiscardHandler)
}

func newRiverInserter(pool *pgxpool.Pool, schema string) (*river.Client[pgx.Tx], error) {
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:  schema,
		Workers: riverWorkers(nil),
		Logger:  quietLogger(),
	})
}

func (r *riverC) Setup(ctx context.Context, e *env) error {
	if err := freshSchema(ctx, e.pool, r.schema()); err != nil {
		return err
	}
	m, err := rivermigrate.New(riverpgxv5.New(e.pool), &rivermigrate.Config{Schema: r.schema(), Logger: quietLogger()})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river: migrate: %w", err)
	}
	if r.client, err = newRiverInserter(e.pool, r.schema()); err != nil {
		return err
	}
	return createAccounts(ctx, e.pool, r.schema())
}

func (r *riverC) Reset(ctx context.Context, e *env, checkpoint bool) error {
	return resetPG(ctx, e, r.schema(), []string{"river_migration"}, checkpoint)
}

func (r *riverC) Producer(ctx context.Context, e *env, async bool) (producer, error) {
	client := r.client
	if async {
		var err error
		if client, err = newRiverInserter(e.asyncPool, r.schema()); err != nil {
			return nil, err
		}
	}
	return newPGProducer(e, async, r.schema(), func(ctx context.Context, tx pgx.Tx, id uuid.UUID, key int, payload []byte) error {
		_, err := client.InsertTx(ctx, tx, outboxArgs{ID: id, Key: key, Payload: payload}, nil)
		return err
	}), nil
}

// Preload uses InsertManyFast (COPY) in batches of 5,000, as riverbench does.
func (r *riverC) Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error {
	for _, b := range chunks(events, 5000) {
		params := make([]river.InsertManyParams, len(b))
		for i, m := range b {
			params[i] = river.InsertManyParams{Args: outboxArgs{ID: EventID(nonce, m.G), Key: m.Key, Payload: EncodePayload(m)}}
		}
		if _, err := r.client.InsertManyFast(ctx, params); err != nil {
			return err
		}
	}
	return nil
}

func (r *riverC) Analyze(ctx context.Context, e *env) error { return analyzeSchema(ctx, e, r.schema()) }

func (r *riverC) RelayArgs(e *env) []string { return []string{"--schema", r.schema()} }

func (r *riverC) Teardown(ctx context.Context, e *env) error {
	_, err := e.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+r.schema()+` CASCADE`)
	return err
}

// Relay side.

func riverRelay(ctx context.Context, c *childConfig, cfg riverConfig, sink *ferrynats.Sink) (runFunc, func(), error) {
	pool, err := c.openPool(ctx, 8)
	if err != nil {
		return nil, nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:            c.schema,
		Workers:           riverWorkers(sink),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.maxWorkers}},
		FetchCooldown:     cfg.fetchCooldown,
		FetchPollInterval: cfg.fetchPollInterval,
		Logger:            c.logger(),
	})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	run := func(ctx context.Context) error {
		// Start on a context that is not cancelled: cancelling Start's
		// context is River's hard stop; Stop below is the graceful one.
		if err := client.Start(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		<-ctx.Done()
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return client.Stop(stopCtx)
	}
	return run, pool.Close, nil
}
