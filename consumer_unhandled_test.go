package ferry_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
)

// An event of a type nobody handles fails, naming its type, and goes DEAD
// after its attempts; once a handler exists, a redrive runs it.
func TestConsumerUnhandledTypeFailsByDefault(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	table := effects(t, drv)
	dead := make(chan *ferry.DeadEvent, 1)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "unhandled", MaxAttempts: 2, RetryBase: 10 * time.Millisecond,
		RetryMax: 20 * time.Millisecond, PollInterval: 20 * time.Millisecond, DeadPolicy: ferry.Continue,
		OnDead: func(_ context.Context, d *ferry.DeadEvent) { dead <- d }})
	require.NoError(t, err)
	c.HandleEvent("OrderPlaced", func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	startConsumer(t, c)
	evs := events(2, 1)
	evs[0].Type = "OrderRefunded" // shipped by the producer before this group handles it
	_, err = c.Ingest(context.Background(), evs)
	require.NoError(t, err)
	var d *ferry.DeadEvent
	select {
	case d = <-dead:
	case <-time.After(30 * time.Second):
		t.Fatal("the unhandled event did not go DEAD")
	}
	require.Equal(t, evs[0].ID, d.Event.ID)
	require.Equal(t, 2, d.Attempts)
	require.ErrorContains(t, d.Err, `no handler for event type "OrderRefunded"`)
	require.ErrorContains(t, d.Err, "SkipUnhandled")
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) == 1 }, 10*time.Second, 20*time.Millisecond,
		"Continue: the key's next event ran")
}

// SkipUnhandled marks such events processed, counts them and logs once per
// type.
func TestConsumerSkipUnhandled(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	var logs syncbuf.Buffer
	reg := prometheus.NewRegistry()
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "skipper", SkipUnhandled: true, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Hooks: []ferryhook.Hook{ferryprom.New(reg)}})
	require.NoError(t, err)
	startConsumer(t, c)
	evs := events(3, 3)
	for _, ev := range evs {
		ev.Type = "Unknown"
	}
	_, err = c.Ingest(context.Background(), evs)
	require.NoError(t, err)
	skipped := func() float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if mf.GetName() == "ferry_consumer_attempts_total" && l.GetName() == "outcome" && l.GetValue() == "skipped" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	require.Eventually(t, func() bool { return skipped() == 3 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, strings.Count(logs.String(), "skipping events of a type"), "logged once per type: %s", logs.String())
}

func TestConsumerHandlersAreFrozenAtRun(t *testing.T) {
	t.Parallel()
	c, err := ferry.NewConsumer(newPG(t), &ferry.ConsumerConfig{Group: "frozen", PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	handled := make(chan struct{}, 1)
	c.HandleAll(func(context.Context, pgx.Tx, *ferry.Event) error {
		select {
		case handled <- struct{}{}:
		default:
		}
		return nil
	})
	startConsumer(t, c)
	_, err = c.Ingest(context.Background(), events(1, 1))
	require.NoError(t, err)
	<-handled // Run is under way
	require.PanicsWithValue(t, `ferry: HandleEvent("Late") on consumer frozen after Run: register every handler before Consumer.Run (the workers read them without a lock)`,
		func() { c.HandleEvent("Late", func(context.Context, pgx.Tx, *ferry.Event) error { return nil }) })
}

// beginFails is a driver whose first handler transactions cannot begin.
type beginFails struct {
	*ferrypg.Driver[pgx.Tx]
	failures atomic.Int32
}

func (b *beginFails) RunInTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if b.failures.Add(-1) >= 0 {
		return fmt.Errorf("ferrypg: begin: %w: %w", ferrydriver.ErrTxNotBegun, context.DeadlineExceeded)
	}
	return b.Driver.RunInTx(ctx, fn)
}

// A transaction that cannot begin (the pool is exhausted) is not an
// attempt: with MaxAttempts 1 the event still runs, once, and is processed.
func TestConsumerBeginFailureIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	pg := newPG(t)
	drv := &beginFails{Driver: pg}
	drv.failures.Store(2)
	table := effects(t, pg)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "nobegin", MaxAttempts: 1, RetryBase: 20 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	var runs atomic.Int32
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		runs.Add(1)
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	startConsumer(t, c)
	ev := events(1, 1)[0]
	_, err = c.Ingest(context.Background(), []*ferry.Event{ev})
	require.NoError(t, err)
	inbox := pgx.Identifier{pg.Schema(), "inbox"}.Sanitize()
	require.Eventually(t, func() bool {
		return count(t, `SELECT count(*) FROM `+inbox+` WHERE event_id = $1 AND state = 'processed'`, ev.ID) == 1
	}, 10*time.Second, 20*time.Millisecond, "processed, not DEAD")
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, 1, count(t, `SELECT attempts FROM `+inbox+` WHERE event_id = $1`, ev.ID), "the two that could not begin are not counted")
}

// Run warns when the pool cannot serve the workers' handlers plus claims.
func TestConsumerWarnsOfASmallPool(t *testing.T) {
	t.Parallel()
	pg := newPG(t)
	cfg, err := pgxpool.ParseConfig(ferrypgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	small, err := ferrypg.New(pool, &ferrypg.Config{Schema: pg.Schema()})
	require.NoError(t, err)
	var logs syncbuf.Buffer
	c, err := ferry.NewConsumer(small, &ferry.ConsumerConfig{Group: "small", Workers: 8, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	startConsumer(t, c)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "the database pool is smaller than the consumer needs")
	},
		30*time.Second, 10*time.Millisecond)
	require.Contains(t, logs.String(), "pool_max_conns=4 workers=8 needed=10")
}

// countsFail is a driver whose inbox counts fail.
type countsFail struct{ *ferrypg.Driver[pgx.Tx] }

func (countsFail) InboxCounts(context.Context, string) (map[ferrydriver.InboxState]int64, error) {
	return nil, fmt.Errorf("count: connection refused")
}

// The inbox gauges are refreshed by one process of a group (a lease); a
// failure to refresh them is logged.
func TestConsumerGaugesOneProcessPerGroup(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	series := func(reg *prometheus.Registry) int {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "ferry_consumer_inbox_rows" {
				return len(mf.GetMetric())
			}
		}
		return 0
	}
	var regs []*prometheus.Registry
	for range 2 {
		reg := prometheus.NewRegistry()
		c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "gauged", Hooks: []ferryhook.Hook{ferryprom.New(reg)}})
		require.NoError(t, err)
		startConsumer(t, c)
		regs = append(regs, reg)
	}
	require.Eventually(t, func() bool { return series(regs[0])+series(regs[1]) == 4 }, 10*time.Second, 20*time.Millisecond,
		"one process exports the four states")
	require.True(t, series(regs[0]) == 0 || series(regs[1]) == 0, "only one of them")

	var logs syncbuf.Buffer
	c, err := ferry.NewConsumer(countsFail{drv}, &ferry.ConsumerConfig{Group: "ungauged", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	startConsumer(t, c)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "refreshing the inbox gauges failed") }, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, logs.String(), "connection refused")
}
