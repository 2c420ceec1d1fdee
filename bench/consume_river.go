package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// riverApplyConfig is the River consumer's client: riverbench's fetch
// settings (as river-tuned) with 32 workers, which applied a 5,000-event
// backlog faster here than 8 or 100 (each worker holds a connection for
// its transaction; 100 made the transactions queue on 2 cores).
var riverApplyConfig = riverConfig{name: "river-jobcompletetx", fetchCooldown: 2 * time.Millisecond, fetchPollInterval: 20 * time.Millisecond, maxWorkers: 32}

// applyArgs is the River job of the consume scenario: one event to apply.
type applyArgs struct {
	Payload []byte `json:"payload"`
}

func (applyArgs) Kind() string { return "ferrybench_apply" }

// applyWorker applies a job's event the way River gets an exactly-once
// effect: it opens a transaction, upserts, marks the job completed in it
// with river.JobCompleteTx and commits.
type applyWorker struct {
	river.WorkerDefaults[applyArgs]
	pool  *pgxpool.Pool
	rec   *applyRecorder
	table string
}

func (w *applyWorker) Work(ctx context.Context, job *river.Job[applyArgs]) error {
	if w.pool == nil {
		return errors.New("this process only inserts jobs")
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if err := applyOne(ctx, tx, w.rec, w.table, job.Args.Payload); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// riverApply is River as an exactly-once consumer: the backlog is jobs
// (InsertManyFast), and the child's worker applies each in its own
// transaction with JobCompleteTx. River fetches with FOR UPDATE SKIP
// LOCKED across concurrent workers: no per-key order.
type riverApply struct {
	prefix string
	cfg    riverConfig
	client *river.Client[pgx.Tx]
}

func (r *riverApply) Name() string { return r.cfg.name }

func (r *riverApply) Describe() string {
	return fmt.Sprintf("river v0.51.2 (riverpgxv5), a job per event inserted with InsertManyFast (5,000 per call); the worker opens a transaction, upserts, calls river.JobCompleteTx[*riverpgxv5.Driver] and commits (River's completer then finds the job completed already); MaxWorkers %d on the default queue, FetchCooldown %s, FetchPollInterval %s, other settings default",
		r.cfg.maxWorkers, r.cfg.fetchCooldown, r.cfg.fetchPollInterval)
}

func (r *riverApply) OrderedPerKey() bool { return false }

func (r *riverApply) schema() string { return schemaName(r.prefix, "consume_"+r.Name()) }

func (r *riverApply) keep() []string { return []string{"river_migration"} }

func applyWorkers(w *applyWorker) *river.Workers {
	ws := river.NewWorkers()
	river.AddWorker(ws, w)
	return ws
}

func (r *riverApply) Setup(ctx context.Context, e *env) error {
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
	r.client, err = river.NewClient(riverpgxv5.New(e.pool), &river.Config{
		Schema:  r.schema(),
		Workers: applyWorkers(&applyWorker{}),
		Logger:  quietLogger(),
	})
	if err != nil {
		return err
	}
	return createProjection(ctx, e, r.schema())
}

// Preload uses InsertManyFast (COPY) in batches of 5,000, in key order.
func (r *riverApply) Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error {
	for _, b := range chunks(events, 5000) {
		params := make([]river.InsertManyParams, len(b))
		for i, m := range b {
			params[i] = river.InsertManyParams{Args: applyArgs{Payload: EncodePayload(m)}}
		}
		if _, err := r.client.InsertManyFast(ctx, params); err != nil {
			return err
		}
	}
	return nil
}

// Child side.

func riverApplyConsumer(ctx context.Context, c *childConfig, cfg riverConfig) (runFunc, func(), error) {
	rec := newApplyRecorder()
	pool, err := c.openTracedPool(ctx, cfg.maxWorkers+8, rec)
	if err != nil {
		return nil, nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:            c.schema,
		Workers:           applyWorkers(&applyWorker{pool: pool, rec: rec, table: projectionTable(c.schema)}),
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
		// As riverRelay: Start on a context that is not cancelled, Stop
		// gracefully.
		if err := client.Start(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		<-ctx.Done()
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err := client.Stop(stopCtx)
		if werr := rec.write(c.stats); err == nil {
			err = werr
		}
		return err
	}
	return run, pool.Close, nil
}
