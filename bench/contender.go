package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// env is what the driver process gives contenders.
type env struct {
	pool      *pgxpool.Pool // synchronous_commit = on
	asyncPool *pgxpool.Pool // synchronous_commit = off, for the ceiling
	dbURL     string
	keys      int
	tmpDir    string // for SQLite files
	log       io.Writer
}

// contender is one outbox implementation under test, as seen from the
// driver process. Its relay runs in the child process (see relay.go).
type contender interface {
	Name() string
	// Describe says how it is configured, for the summary.
	Describe() string
	// OrderedPerKey says whether it promises per-key order; inversions of
	// one that does not are reported, not scored.
	OrderedPerKey() bool
	// Setup creates its own schema (or file) with its tables and the
	// accounts table.
	Setup(ctx context.Context, e *env) error
	// Reset empties everything for the next phase and re-seeds accounts.
	Reset(ctx context.Context, e *env, checkpoint bool) error
	// Producer returns the producer transaction, on a connection with
	// synchronous commit on, or off when async.
	Producer(ctx context.Context, e *env, async bool) (producer, error)
	// Preload writes a backlog through its fast path, relay stopped.
	Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error
	// Analyze refreshes planner statistics after a preload.
	Analyze(ctx context.Context, e *env) error
	// RelayArgs are the child's arguments that select and place the relay.
	RelayArgs(e *env) []string
	Teardown(ctx context.Context, e *env) error
}

// producer runs one producer transaction: the business update of account
// key, plus the contender's insert of one event built from the account's
// new balance (its per-key sequence).
type producer interface {
	Produce(ctx context.Context, nonce uint64, g int64, key int, intended int64) error
	Close()
}

// AllContenders lists the contenders in their default order.
var AllContenders = []string{"ferry", "ferry-sqlite", "watermill", "watermill-tuned", "river", "river-tuned", "naive-cursor", "naive-claim"}

// newContender returns the named contender; its schema is prefix followed
// by its name.
func newContender(name, prefix string) (contender, error) {
	switch name {
	case "ferry":
		return &ferryPG{prefix: prefix}, nil
	case "ferry-sqlite":
		return &ferrySQLite{}, nil
	case "watermill":
		return &watermillC{prefix: prefix, cfg: watermillStock}, nil
	case "watermill-tuned":
		return &watermillC{prefix: prefix, cfg: watermillTuned}, nil
	case "river":
		return &riverC{prefix: prefix, cfg: riverDefault}, nil
	case "river-tuned":
		return &riverC{prefix: prefix, cfg: riverTuned}, nil
	case "naive-cursor":
		return &naiveC{prefix: prefix, mode: "cursor"}, nil
	case "naive-claim":
		return &naiveC{prefix: prefix, mode: "claim"}, nil
	}
	return nil, fmt.Errorf("unknown contender %q (known: %s)", name, strings.Join(AllContenders, ", "))
}

// schemaName is the PostgreSQL schema of a contender.
func schemaName(prefix, contender string) string {
	return prefix + strings.ReplaceAll(contender, "-", "_")
}

// createAccounts creates the business table in schema.
func createAccounts(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	_, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.accounts (id integer PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`)
	return err
}

// freshSchema drops and creates schema.
func freshSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+schema)
	return err
}

func schemaTables(ctx context.Context, pool *pgxpool.Pool, schema string) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1`, schema)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	sort.Strings(names)
	return names, err
}

// resetPG truncates every table of schema except keep (migration
// bookkeeping), re-seeds the accounts, runs VACUUM ANALYZE on the tables
// and, when asked, a CHECKPOINT.
func resetPG(ctx context.Context, e *env, schema string, keep []string, checkpoint bool) error {
	all, err := truncateSchema(ctx, e, schema, keep)
	if err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+schema+`.accounts (id, balance) SELECT g, 0 FROM generate_series(1, $1) g`, e.keys); err != nil {
		return fmt.Errorf("seed accounts: %w", err)
	}
	return vacuumSchema(ctx, e, schema, all, checkpoint)
}

// truncateSchema empties every table of schema except keep and returns
// all its tables, qualified.
func truncateSchema(ctx context.Context, e *env, schema string, keep []string) ([]string, error) {
	tables, err := schemaTables(ctx, e.pool, schema)
	if err != nil {
		return nil, err
	}
	var trunc, all []string
	for _, t := range tables {
		q := schema + "." + pgx.Identifier{t}.Sanitize()
		all = append(all, q)
		if !slices.Contains(keep, t) {
			trunc = append(trunc, q)
		}
	}
	if len(trunc) > 0 {
		if _, err := e.pool.Exec(ctx, `TRUNCATE `+strings.Join(trunc, ", ")+` RESTART IDENTITY CASCADE`); err != nil {
			return nil, fmt.Errorf("truncate %s: %w", schema, err)
		}
	}
	return all, nil
}

// vacuumSchema runs VACUUM (ANALYZE) on tables and, when asked, a
// CHECKPOINT.
func vacuumSchema(ctx context.Context, e *env, schema string, tables []string, checkpoint bool) error {
	if _, err := e.pool.Exec(ctx, `VACUUM (ANALYZE) `+strings.Join(tables, ", ")); err != nil {
		return fmt.Errorf("vacuum %s: %w", schema, err)
	}
	if checkpoint {
		if _, err := e.pool.Exec(ctx, `CHECKPOINT`); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	return nil
}

func analyzeSchema(ctx context.Context, e *env, schema string) error {
	tables, err := schemaTables(ctx, e.pool, schema)
	if err != nil || len(tables) == 0 {
		return err
	}
	for i, t := range tables {
		tables[i] = schema + "." + pgx.Identifier{t}.Sanitize()
	}
	_, err = e.pool.Exec(ctx, `ANALYZE `+strings.Join(tables, ", "))
	return err
}

// pgProducer is the producer transaction every PostgreSQL contender shares:
// BEGIN; UPDATE accounts … RETURNING balance; <insert>; COMMIT.
type pgProducer struct {
	pool   *pgxpool.Pool
	update string
	insert func(ctx context.Context, tx pgx.Tx, id uuid.UUID, key int, payload []byte) error
}

func newPGProducer(e *env, async bool, schema string, insert func(ctx context.Context, tx pgx.Tx, id uuid.UUID, key int, payload []byte) error) *pgProducer {
	pool := e.pool
	if async {
		pool = e.asyncPool
	}
	return &pgProducer{
		pool:   pool,
		update: `UPDATE ` + schema + `.accounts SET balance = balance + 1 WHERE id = $1 RETURNING balance`,
		insert: insert,
	}
}

func (p *pgProducer) Produce(ctx context.Context, nonce uint64, g int64, key int, intended int64) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var seq int64
		if err := tx.QueryRow(ctx, p.update, key).Scan(&seq); err != nil {
			return fmt.Errorf("update account: %w", err)
		}
		payload := EncodePayload(Meta{G: g, Key: key, Seq: seq, Intended: intended})
		return p.insert(ctx, tx, EventID(nonce, g), key, payload)
	})
}

func (p *pgProducer) Close() {}

// partitionByKey splits events into n slices so that all events of a key
// are in one slice, in their original order: parallel preloaders then keep
// per-key order.
func partitionByKey(events []Meta, n int) [][]Meta {
	out := make([][]Meta, n)
	for _, m := range events {
		i := m.Key % n
		out[i] = append(out[i], m)
	}
	return out
}

func chunks[T any](s []T, size int) [][]T {
	var out [][]T
	for len(s) > 0 {
		n := min(size, len(s))
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}
