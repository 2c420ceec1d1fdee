package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

const eventType = "BenchEvent"

func ferryEvent(id uuid.UUID, key int, payload []byte) *ferry.Event {
	return &ferry.Event{ID: id, Topic: Topic, Key: KeyString(key), Type: eventType, Payload: payload}
}

// ferryPG is Ferry with its PostgreSQL driver, through the production path:
// ferrypg.New + Migrate, ferry.Client.EmitTx in the producer transaction,
// ferry.NewRelay(...).Run with the ferrynats sink, all defaults.
type ferryPG struct {
	prefix string
	client *ferry.Client[pgx.Tx]
}

func (f *ferryPG) Name() string { return "ferry" }

func (f *ferryPG) Describe() string {
	return "ferrypg (snapshot-closed batches, LISTEN/NOTIFY wake-ups while idle), RelayConfig defaults: BatchSize 500, PollInterval 500 ms"
}

func (f *ferryPG) OrderedPerKey() bool { return true }

func (f *ferryPG) schema() string { return schemaName(f.prefix, f.Name()) }

func (f *ferryPG) Setup(ctx context.Context, e *env) error {
	if _, err := e.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+f.schema()+` CASCADE`); err != nil {
		return err
	}
	drv, err := ferrypg.New(e.pool, &ferrypg.Config{Schema: f.schema()})
	if err != nil {
		return err
	}
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		return err
	}
	if f.client, err = ferry.NewClient(drv, nil); err != nil {
		return err
	}
	return createAccounts(ctx, e.pool, f.schema())
}

func (f *ferryPG) Reset(ctx context.Context, e *env, checkpoint bool) error {
	// The settings row (the stored partition count) is schema, not data.
	return resetPG(ctx, e, f.schema(), []string{"migrations", "settings"}, checkpoint)
}

func (f *ferryPG) Producer(ctx context.Context, e *env, async bool) (producer, error) {
	client := f.client
	if async {
		drv, err := ferrypg.New(e.asyncPool, &ferrypg.Config{Schema: f.schema()})
		if err != nil {
			return nil, err
		}
		if client, err = ferry.NewClient(drv, nil); err != nil {
			return nil, err
		}
	}
	return newPGProducer(e, async, f.schema(), func(ctx context.Context, tx pgx.Tx, id uuid.UUID, key int, payload []byte) error {
		return client.EmitTx(ctx, tx, ferryEvent(id, key, payload))
	}), nil
}

// Preload uses Client.Emit with 1,000 events per transaction from 4
// goroutines, keys partitioned among them.
func (f *ferryPG) Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error {
	return parallelPreload(events, 4, 1000, func(batch []Meta) error {
		evs := make([]*ferry.Event, len(batch))
		for i, m := range batch {
			evs[i] = ferryEvent(EventID(nonce, m.G), m.Key, EncodePayload(m))
		}
		return f.client.Emit(ctx, evs...)
	})
}

func (f *ferryPG) Analyze(ctx context.Context, e *env) error {
	return analyzeSchema(ctx, e, f.schema())
}

func (f *ferryPG) RelayArgs(e *env) []string { return []string{"--schema", f.schema()} }

func (f *ferryPG) Teardown(ctx context.Context, e *env) error {
	_, err := e.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+f.schema()+` CASCADE`)
	return err
}

// parallelPreload runs write over batches of at most size events, from
// workers goroutines with keys partitioned among them.
func parallelPreload(events []Meta, workers, size int, write func([]Meta) error) error {
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w, part := range partitionByKey(events, workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, b := range chunks(part, size) {
				if err := write(b); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ferrySQLite is Ferry's embedded driver: producer transactions, outbox and
// relay bookkeeping in one SQLite file (WAL, synchronous=FULL, the
// default). The relay runs in the child process on the same file and
// notices new commits through PRAGMA data_version every 20 ms.
type ferrySQLite struct {
	path   string
	drv    *ferrysqlite.Driver
	client *ferry.Client[*sql.Tx]
}

func (f *ferrySQLite) Name() string { return "ferry-sqlite" }

func (f *ferrySQLite) Describe() string {
	return "ferrysqlite, one file in WAL mode, synchronous=FULL (NORMAL for the sync-off ceiling), relay in another process (wake-ups by PRAGMA data_version, 20 ms), RelayConfig defaults"
}

func (f *ferrySQLite) OrderedPerKey() bool { return true }

func (f *ferrySQLite) open(ctx context.Context, e *env, sync string) error {
	if f.drv != nil {
		_ = f.drv.Close()
		f.drv = nil
	}
	drv, err := ferrysqlite.Open(f.path, &ferrysqlite.Config{Synchronous: sync})
	if err != nil {
		return err
	}
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		_ = drv.Close()
		return err
	}
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL DEFAULT 0)`); err != nil {
		_ = drv.Close()
		return err
	}
	f.drv = drv
	f.client, err = ferry.NewClient(drv, nil)
	return err
}

func (f *ferrySQLite) Setup(ctx context.Context, e *env) error {
	f.path = filepath.Join(e.tmpDir, "ferry-bench.db")
	return f.Reset(ctx, e, false)
}

// Reset removes the file and creates it again.
func (f *ferrySQLite) Reset(ctx context.Context, e *env, _ bool) error {
	if f.drv != nil {
		_ = f.drv.Close()
		f.drv = nil
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(f.path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := f.open(ctx, e, "FULL"); err != nil {
		return err
	}
	tx, err := f.drv.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO accounts (id, balance) VALUES (?, 0)`)
	if err != nil {
		return err
	}
	for k := 1; k <= e.keys; k++ {
		if _, err := stmt.ExecContext(ctx, k); err != nil {
			return err
		}
	}
	return tx.Commit()
}

type sqliteProducer struct {
	drv    *ferrysqlite.Driver
	client *ferry.Client[*sql.Tx]
}

func (f *ferrySQLite) Producer(ctx context.Context, e *env, async bool) (producer, error) {
	sync := "FULL"
	if async {
		sync = "NORMAL"
	}
	if err := f.open(ctx, e, sync); err != nil {
		return nil, err
	}
	return &sqliteProducer{drv: f.drv, client: f.client}, nil
}

func (p *sqliteProducer) Produce(ctx context.Context, nonce uint64, g int64, key int, intended int64) error {
	tx, err := p.drv.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var seq int64
	if err := tx.QueryRowContext(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = ? RETURNING balance`, key).Scan(&seq); err != nil {
		return fmt.Errorf("update account: %w", err)
	}
	payload := EncodePayload(Meta{G: g, Key: key, Seq: seq, Intended: intended})
	if err := p.client.EmitTx(ctx, tx, ferryEvent(EventID(nonce, g), key, payload)); err != nil {
		return err
	}
	return tx.Commit()
}

func (p *sqliteProducer) Close() {}

// Preload emits 1,000 events per transaction (one writer).
func (f *ferrySQLite) Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error {
	if err := f.open(ctx, e, "FULL"); err != nil {
		return err
	}
	for _, b := range chunks(events, 1000) {
		evs := make([]*ferry.Event, len(b))
		for i, m := range b {
			evs[i] = ferryEvent(EventID(nonce, m.G), m.Key, EncodePayload(m))
		}
		if err := f.client.Emit(ctx, evs...); err != nil {
			return err
		}
	}
	return nil
}

func (f *ferrySQLite) Analyze(ctx context.Context, e *env) error {
	_, err := f.drv.DB().ExecContext(ctx, `ANALYZE`)
	return err
}

func (f *ferrySQLite) RelayArgs(e *env) []string { return []string{"--sqlite", f.path} }

func (f *ferrySQLite) Teardown(ctx context.Context, e *env) error {
	if f.drv != nil {
		_ = f.drv.Close()
		f.drv = nil
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		_ = os.Remove(f.path + suffix)
	}
	return nil
}

// Relay side.

func ferryPGRelay(ctx context.Context, c *childConfig, sink *ferrynats.Sink) (runFunc, func(), error) {
	pool, err := c.openPool(ctx, 4)
	if err != nil {
		return nil, nil, err
	}
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: c.schema})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{Logger: c.logger()})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return relay.Run, pool.Close, nil
}

func ferrySQLiteRelay(ctx context.Context, c *childConfig, sink *ferrynats.Sink) (runFunc, func(), error) {
	drv, err := ferrysqlite.Open(c.sqlite, nil)
	if err != nil {
		return nil, nil, err
	}
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{Logger: c.logger()})
	if err != nil {
		_ = drv.Close()
		return nil, nil, err
	}
	return relay.Run, func() { _ = drv.Close() }, nil
}
