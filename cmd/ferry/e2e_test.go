package main

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent/ferryeventtest"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
)

// TestOutboxToConsumerThroughJetStream: producer transactions → relay →
// JetStream → durable source → consumer inbox → handler, each event's
// effect exactly once and each key in order.
func TestOutboxToConsumerThroughJetStream(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)

	nc := testNATS(t)
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: f.stream, SubjectPrefix: f.prefix, CreateStream: true})
	require.NoError(t, err)
	relay, err := ferry.NewRelay(f.drv, sink, &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second, Logger: quiet})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(runCtx) }()

	table := pgx.Identifier{f.schema, "effects"}.Sanitize()
	_, err = ferrypgtest.Pool(t).Exec(ctx, `CREATE TABLE `+table+` (n bigserial PRIMARY KEY, event_id uuid NOT NULL, key text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(t, err)
	c, err := ferry.NewConsumer(f.drv, &ferry.ConsumerConfig{Group: "projection", PollInterval: 20 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.Run(runCtx) }()
	source, err := ferrynats.NewSource(ctx, f.js, &ferrynats.SourceConfig{Stream: f.stream, Durable: "projection", SubjectPrefix: f.prefix, Logger: quiet})
	require.NoError(t, err)
	sourceDone := make(chan error, 1)
	go func() {
		sourceDone <- c.Consume(runCtx, source)
	}()

	emitted := f.produce(ctx, 3000, 100, 4, 3000)
	require.Eventually(t, func() bool {
		var n int
		return ferrypgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n) == nil && n >= len(emitted)
	}, time.Minute, 50*time.Millisecond)
	stop()
	require.NoError(t, <-relayDone)
	require.NoError(t, <-sourceDone)
	require.NoError(t, <-consumerDone)

	var total, distinct, violations int
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+table).Scan(&total, &distinct))
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM (
		SELECT seq - lag(seq, 1, 0::bigint) OVER (PARTITION BY key ORDER BY n) AS step FROM `+table+`) s WHERE step <> 1`).Scan(&violations))
	require.Equal(t, len(emitted), distinct, "every event applied")
	require.Equal(t, distinct, total, "none applied twice")
	require.Zero(t, violations, "each key applied in commit order")
}

// TestEdgeCaseEventsFromEmitToHandler runs the edge-case table
// (ferryeventtest) as a producer would: Emit on PostgreSQL refuses the
// cases it must, naming the field; the others go through the relay,
// JetStream, the durable source and the consumer inbox, and each handler
// sees its event exactly as it was emitted.
func TestEdgeCaseEventsFromEmitToHandler(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)

	var accepted []*ferry.Event
	for _, c := range ferryeventtest.Cases(0) {
		err := f.client.Emit(ctx, c.Event)
		if !c.Refused() {
			require.NoError(t, err, "case %q must be accepted at emit", c.Name)
			accepted = append(accepted, c.Event)
			continue
		}
		require.ErrorIs(t, err, c.Err, "case %q must be refused at emit", c.Name)
		var ve *ferry.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, c.Field, ve.Field, "case %q", c.Name)
	}
	for _, ev := range accepted {
		ev.Seq = 1 // assigned by the outbox: each case has a key of its own
	}

	nc := testNATS(t)
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: f.stream, SubjectPrefix: f.prefix, CreateStream: true})
	require.NoError(t, err)
	relay, err := ferry.NewRelay(f.drv, sink, &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second, Logger: quiet})
	require.NoError(t, err)
	c, err := ferry.NewConsumer(f.drv, &ferry.ConsumerConfig{Group: "edge", PollInterval: 20 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	var mu sync.Mutex
	handled := map[uuid.UUID]*ferry.Event{}
	c.HandleAll(func(_ context.Context, _ pgx.Tx, ev *ferry.Event) error {
		cp := *ev
		cp.Headers = maps.Clone(ev.Headers)
		cp.Payload = bytes.Clone(ev.Payload)
		mu.Lock()
		handled[ev.ID] = &cp
		mu.Unlock()
		return nil
	})
	source, err := ferrynats.NewSource(ctx, f.js, &ferrynats.SourceConfig{Stream: f.stream, Durable: "edge", SubjectPrefix: f.prefix, Logger: quiet})
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return relay.Run(runCtx) })
	g.Go(func() error { return c.Run(runCtx) })
	g.Go(func() error { return c.Consume(runCtx, source) })
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) >= len(accepted)
	}, time.Minute, 20*time.Millisecond, "every accepted event must reach its handler")
	stop()
	require.NoError(t, g.Wait())

	require.Len(t, handled, len(accepted))
	for _, want := range accepted {
		ferryeventtest.RequireSame(t, want, handled[want.ID])
	}
	dead, err := f.drv.ListDeadLetters(ctx, &ferrydriver.ListDeadLettersParams{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, dead, "no accepted event may be dead-lettered on the way")
}
