package main

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// The tests that run consumer processes (TestOneReaderPerDurable,
// TestConsumerSharesOverReplicas*) share these: in the child, a replica of
// group "billing" whose handler records each event's effect with its
// process ID; in the test, the schema those effects go to and the checks
// made of them.

// replica is a child process's consumer of group "billing".
type replica struct {
	pool *pgxpool.Pool
	c    *ferry.Consumer[pgx.Tx]
}

// openReplica opens the consumer of group "billing" (cfg names the group)
// on schema, whose handler writes each event to <schema>.effects with this
// process's ID.
func openReplica(ctx context.Context, schema string, cfg *ferry.ConsumerConfig) (*replica, error) {
	pcfg, err := pgxpool.ParseConfig(ferrypgtest.URL())
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	c, err := ferry.NewConsumer(drv, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	pid := os.Getpid()
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event_id, key, seq, pid) VALUES ($1, $2, $3, $4)`, ev.ID, ev.Key, ev.Seq, pid)
		return err
	})
	return &replica{pool: pool, c: c}, nil
}

// run runs the consumer and Consume on src until ctx ends (stop ends it
// when either fails) and returns the process's exit code.
func (r *replica) run(ctx context.Context, stop context.CancelFunc, src ferrysink.Source) int {
	defer r.pool.Close()
	errs := make(chan error, 2)
	go func() { errs <- r.c.Run(ctx) }()
	go func() { errs <- r.c.Consume(ctx, src) }()
	code := 0
	for range 2 {
		if err := <-errs; err != nil {
			code = childFailed(err)
			stop()
		}
	}
	return code
}

// childFailed reports a child's error and returns its exit code.
func childFailed(err error) int {
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// childJetStream connects a child to the test's NATS server.
func childJetStream() (jetstream.JetStream, func(), error) {
	nc, err := nats.Connect(natsURL())
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}

// replicaStore is the test's side: a migrated schema with the effects
// table the replicas write, and more tables of the schema: each of tables
// is "<name> (<columns>)".
type replicaStore struct {
	t       *testing.T
	pool    *pgxpool.Pool
	drv     *ferrypg.Driver[pgx.Tx]
	schema  string
	effects string
}

func newReplicaStore(t *testing.T, tables ...string) *replicaStore {
	ctx := context.Background()
	pool := ferrypgtest.Pool(t)
	schema := ferrypgtest.Schema(t)
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	s := &replicaStore{t: t, pool: pool, drv: drv, schema: schema, effects: pgx.Identifier{schema, "effects"}.Sanitize()}
	_, err = pool.Exec(ctx, `CREATE TABLE `+s.effects+` (n bigserial PRIMARY KEY, event_id uuid NOT NULL, key text NOT NULL, seq bigint NOT NULL, pid int NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	for _, table := range tables {
		_, err = pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema}.Sanitize()+`.`+table)
		require.NoError(t, err)
	}
	return s
}

// count runs a count query.
func (s *replicaStore) count(q string, args ...any) int {
	var n int
	require.NoError(s.t, s.pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// requireOnceInOrder checks that n events were applied, each once, and
// each key's in order, without gaps.
func (s *replicaStore) requireOnceInOrder(n int) {
	s.t.Helper()
	require.Equal(s.t, n, s.count(`SELECT count(*) FROM `+s.effects), "every event applied once")
	require.Zero(s.t, s.count(`SELECT count(*) FROM (
		SELECT seq - lag(seq, 1, 0::bigint) OVER (PARTITION BY key ORDER BY n) AS step FROM `+s.effects+`) s WHERE step <> 1`), "each key applied in order, without gaps")
}
