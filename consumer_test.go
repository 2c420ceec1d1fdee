package ferry_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// effects creates the table handlers write to, in the driver's schema.
func effects(t *testing.T, drv *ferrypg.Driver[pgx.Tx]) string {
	table := pgx.Identifier{drv.Schema(), "effects"}.Sanitize()
	_, err := ferrypgtest.Pool(t).Exec(context.Background(), `CREATE TABLE `+table+` (
		n bigserial PRIMARY KEY, event_id uuid NOT NULL, key text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(t, err)
	return table
}

// startConsumer runs c until the test ends, then stops it and requires
// that Run returned nil.
func startConsumer(t *testing.T, c *ferry.Consumer[pgx.Tx]) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("Consumer.Run did not return within 30 s of its context's end")
		}
	})
}

func events(n, keys int) []*ferry.Event {
	out := make([]*ferry.Event, n)
	seq := map[string]int64{}
	for i := range out {
		k := "k" + strconv.Itoa(i%keys)
		seq[k]++
		out[i] = &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: k, Type: "OrderPlaced", Seq: seq[k],
			Payload: []byte(`{"n":` + strconv.Itoa(i) + `}`), CreatedAt: time.Now()}
	}
	return out
}

func count(t *testing.T, q string, args ...any) int {
	var n int
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// warmUp returns once c's Run runs: a first event (ingested before it may
// have) applied, its effect the only one in table.
func warmUp(t *testing.T, c *ferry.Consumer[pgx.Tx], table string) {
	t.Helper()
	warm := events(1, 1)[0]
	warm.Key = "warm"
	_, err := c.Ingest(context.Background(), []*ferry.Event{warm})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) == 1 }, 30*time.Second, 5*time.Millisecond)
}

// Every event delivered three times concurrently: one effect each.
func TestConsumerExactlyOnceEffect(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	table := effects(t, drv)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	startConsumer(t, c)
	evs := events(600, 30)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for i := 0; i < len(evs); i += 50 {
				if _, err := c.Ingest(context.Background(), evs[i:i+50]); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) >= len(evs) }, 30*time.Second, 20*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, len(evs), count(t, `SELECT count(DISTINCT event_id) FROM `+table))
	require.Equal(t, len(evs), count(t, `SELECT count(*) FROM `+table), "no event's effect exists twice")
}

// 8 workers, 10,000 events over 200 keys, random handler latency: every
// key in order, and keys ran in parallel.
func TestConsumerKeyOrderAndParallelism(t *testing.T) {
	t.Parallel()
	n := 10000
	if testing.Short() {
		n = 2000
	}
	drv := newPG(t)
	table := effects(t, drv)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "projector", Workers: 8, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	var running, peak atomic.Int64
	type decoded struct{ N int }
	ferry.Handle(c, "OrderPlaced", func(ctx context.Context, tx pgx.Tx, ev *ferry.Event, msg decoded) error {
		now := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
		}
		if msg.N%7 == 0 {
			time.Sleep(time.Duration(msg.N%3) * time.Millisecond)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	startConsumer(t, c)
	evs := events(n, 200)
	for i := 0; i < n; i += 500 {
		_, err := c.Ingest(context.Background(), evs[i:i+500])
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) >= n }, 2*time.Minute, 50*time.Millisecond)
	// In effect order, each key's Seq runs 1, 2, 3, ...
	violations := count(t, `SELECT count(*) FROM (
		SELECT seq - lag(seq) OVER (PARTITION BY key ORDER BY n) AS step FROM `+table+`) s WHERE step <> 1`)
	require.Zero(t, violations, "per-key order")
	require.Equal(t, n, count(t, `SELECT count(*) FROM `+table))
	t.Logf("%d events over 200 keys; up to %d handlers ran at once", n, peak.Load())
	require.Greater(t, peak.Load(), int64(1), "keys must run in parallel")
}

// A poison event goes DEAD after MaxAttempts, with backoff between
// attempts; its key is held, other keys flow, OnDead fires.
func TestConsumerPoisonEventGoesDead(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	table := effects(t, drv)
	dead := make(chan *ferry.DeadEvent, 1)
	reg := prometheus.NewRegistry()
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "mailer", MaxAttempts: 3, Hooks: []ferryhook.Hook{ferryprom.New(reg)},
		RetryBase: 100 * time.Millisecond, RetryMax: time.Second, PollInterval: 10 * time.Millisecond,
		OnDead: func(_ context.Context, d *ferry.DeadEvent) { dead <- d }})
	require.NoError(t, err)
	var mu sync.Mutex
	var attempts []time.Time
	var fixed atomic.Bool
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		if string(ev.Payload) == `{"n":0}` && !fixed.Load() {
			mu.Lock()
			attempts = append(attempts, time.Now())
			n := len(attempts)
			mu.Unlock()
			if n == 2 {
				panic("boom")
			}
			return errors.New("cannot send mail")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	startConsumer(t, c)
	evs := events(40, 4) // event 0 is k0's first; k0 has 9 more behind it
	_, err = c.Ingest(context.Background(), evs)
	require.NoError(t, err)
	var d *ferry.DeadEvent
	select {
	case d = <-dead:
	case <-time.After(30 * time.Second):
		t.Fatal("OnDead did not fire")
	}
	require.Equal(t, evs[0].ID, d.Event.ID)
	require.Equal(t, 3, d.Attempts)
	require.ErrorContains(t, d.Err, "cannot send mail")
	mu.Lock()
	require.Len(t, attempts, 3)
	for i := 1; i < len(attempts); i++ {
		require.GreaterOrEqual(t, attempts[i].Sub(attempts[i-1]), 40*time.Millisecond, "attempts are spaced by the backoff")
	}
	mu.Unlock()
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) == 30 }, 10*time.Second, 20*time.Millisecond, "other keys flow")
	time.Sleep(200 * time.Millisecond)
	require.Zero(t, count(t, `SELECT count(*) FROM `+table+` WHERE key = 'k0'`), "Hold: the dead event's key waits")
	var lastErr string
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(context.Background(),
		`SELECT last_error FROM `+pgx.Identifier{drv.Schema(), "inbox"}.Sanitize()+` WHERE event_id = $1`, evs[0].ID).Scan(&lastErr))
	require.Contains(t, lastErr, "cannot send mail")
	n, err := testutil.GatherAndCount(reg, "ferry_consumer_attempts_total")
	require.NoError(t, err)
	require.Equal(t, 3, n, "processed, retried and dead series")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ferry_consumer_attempts_total Handler attempts by outcome: processed, retried, dead, claim_lost, skipped (no handler, SkipUnhandled), not_begun (no transaction: not counted).
# TYPE ferry_consumer_attempts_total counter
ferry_consumer_attempts_total{group="mailer",outcome="dead"} 1
ferry_consumer_attempts_total{group="mailer",outcome="processed"} 30
ferry_consumer_attempts_total{group="mailer",outcome="retried"} 2
`), "ferry_consumer_attempts_total"))

	// Fix the handler, redrive: the event applies once, then its key's held
	// events follow in order.
	fixed.Store(true)
	n, err = drv.RedriveInbox(context.Background(), &ferrydriver.InboxIDsParams{Group: "mailer", EventIDs: []uuid.UUID{evs[0].ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	c.Notify()
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table+` WHERE key = 'k0'`) == 10 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, count(t, `SELECT count(*) FROM `+table+` WHERE event_id = $1`, evs[0].ID), "the redriven event applied once")
	require.Zero(t, count(t, `SELECT count(*) FROM (
		SELECT seq - lag(seq, 1, 0::bigint) OVER (PARTITION BY key ORDER BY n) AS step FROM `+table+` WHERE key = 'k0') s WHERE step <> 1`), "k0 in order, starting with the redriven event")
}

func TestConsumerRetryAfterAndGiveUp(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	dead := make(chan *ferry.DeadEvent, 1)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "g", RetryBase: time.Hour, RetryMax: time.Hour, PollInterval: 10 * time.Millisecond,
		OnDead: func(_ context.Context, d *ferry.DeadEvent) { dead <- d }})
	require.NoError(t, err)
	var tries atomic.Int32
	c.HandleEvent("RateLimited", func(context.Context, pgx.Tx, *ferry.Event) error {
		if tries.Add(1) == 1 {
			return ferry.RetryAfter(100*time.Millisecond, errors.New("429 too many requests"))
		}
		return nil
	})
	c.HandleEvent("Invalid", func(context.Context, pgx.Tx, *ferry.Event) error {
		return ferry.GiveUp(errors.New("unknown currency"))
	})
	type typed struct{ Amount int }
	ferry.Handle(c, "Typed", func(context.Context, pgx.Tx, *ferry.Event, typed) error { return nil })
	startConsumer(t, c)
	evs := events(3, 3)
	evs[0].Type, evs[1].Type, evs[2].Type = "RateLimited", "Invalid", "Typed"
	evs[2].Payload = []byte("not json")
	_, err = c.Ingest(context.Background(), evs)
	require.NoError(t, err)
	s, err := ferry.AwaitSettled(context.Background(), drv, "g", []uuid.UUID{evs[0].ID, evs[1].ID, evs[2].ID}, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{evs[0].ID}, s.Settled, "RetryAfter retried after its delay, not the 1 h backoff")
	require.EqualValues(t, 2, tries.Load())
	require.Contains(t, s.Failed[evs[1].ID], "unknown currency", "GiveUp: dead on the first attempt")
	require.Contains(t, s.Failed[evs[2].ID], "decode Typed payload", "an undecodable payload is dead at once")
	<-dead
}

func TestConsumerPanicIsAFailureWithStack(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "g", MaxAttempts: 1, PollInterval: 10 * time.Millisecond,
		OnDead: func(context.Context, *ferry.DeadEvent) {}})
	require.NoError(t, err)
	c.HandleAll(func(context.Context, pgx.Tx, *ferry.Event) error { panic("nil map") })
	startConsumer(t, c)
	evs := events(1, 1)
	_, err = c.Ingest(context.Background(), evs)
	require.NoError(t, err)
	inbox := pgx.Identifier{drv.Schema(), "inbox"}.Sanitize()
	require.Eventually(t, func() bool {
		return count(t, `SELECT count(*) FROM `+inbox+` WHERE state = 'dead'`) == 1
	}, 10*time.Second, 20*time.Millisecond)
	var lastErr string
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(context.Background(), `SELECT last_error FROM `+inbox).Scan(&lastErr))
	require.Contains(t, lastErr, "handler panicked: nil map")
	require.Contains(t, lastErr, "consumer_test.go", "the stack is kept")
}

// A consumer in the producer's database reads the outbox through a relay
// into its inbox: no broker.
func TestConsumerFromFeed(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	table := effects(t, drv)
	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "projector", PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	startConsumer(t, c)
	relay, err := ferry.NewRelay(drv, c.Sink(), &ferry.RelayConfig{Feed: "projector", PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	run(t, relay)
	all := emitMany(t, client, 500, 20, 4, strconv.Itoa)
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) >= len(all) }, 30*time.Second, 20*time.Millisecond)
	require.Zero(t, count(t, `SELECT count(*) FROM (
		SELECT seq - lag(seq) OVER (PARTITION BY key ORDER BY n) AS step FROM `+table+`) s WHERE step <> 1`))
}

func TestConsumerConfigValidation(t *testing.T) {
	t.Parallel()
	drv, err := ferrypg.New(nil, nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		cfg  ferry.ConsumerConfig
		want string
	}{
		{ferry.ConsumerConfig{}, "Group"},
		{ferry.ConsumerConfig{Group: "g", Workers: -1}, "Workers"},
		{ferry.ConsumerConfig{Group: "g", ClaimTTL: time.Millisecond}, "ClaimTTL"},
		{ferry.ConsumerConfig{Group: "g", MaxAttempts: -1}, "MaxAttempts"},
		{ferry.ConsumerConfig{Group: "g", DeadPolicy: 7}, "DeadPolicy"},
	} {
		_, err := ferry.NewConsumer(drv, &tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

// Retracted events: those processed are undone once by the retraction
// handler, in key order; those not run yet never run; a second retraction
// and a redelivery change nothing.
func TestConsumerRetract(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	table := effects(t, drv)
	// One event per transaction: seq 1 and 2 commit while seq 3 waits (in
	// batches a key's run shares one transaction).
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "indexer", PollInterval: 20 * time.Millisecond, BatchSize: 1})
	require.NoError(t, err)
	gate := make(chan struct{})
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		if ev.Seq == 3 {
			<-gate // the third event of each key waits, so it is unprocessed when retracted
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	c.HandleRetraction(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, -ev.Seq)
		return err
	})
	startConsumer(t, c)
	evs := events(8, 2) // k0: seq 1..4, k1: seq 1..4
	_, err = c.Ingest(context.Background(), evs)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) == 4 }, 10*time.Second, 10*time.Millisecond,
		"seq 1 and 2 of both keys are processed; seq 3 waits")
	var k0s3 uuid.UUID
	for _, ev := range evs {
		if ev.Key == "k0" && ev.Seq == 3 {
			k0s3 = ev.ID
		}
	}
	require.Eventually(t, func() bool {
		st, err := drv.InboxStates(context.Background(), &ferrydriver.InboxIDsParams{Group: "indexer", EventIDs: []uuid.UUID{k0s3}})
		require.NoError(t, err)
		return st[k0s3] != nil && st[k0s3].State == ferrydriver.InboxProcessing
	}, 10*time.Second, 10*time.Millisecond, "k0's seq 3 is claimed (its handler waits)")
	// Retract seq 2, 3 and 4 of k0 (2 processed, 3 running, 4 claimed with
	// it, a run of the key's events, and waiting behind it).
	var k0 []*ferry.Event
	for _, ev := range evs {
		if ev.Key == "k0" && ev.Seq >= 2 {
			k0 = append(k0, ev)
		}
	}
	prior, err := c.Retract(context.Background(), k0)
	require.NoError(t, err)
	require.Equal(t, []ferrydriver.InboxState{ferrydriver.InboxProcessed, ferrydriver.InboxProcessing, ferrydriver.InboxProcessing}, prior)
	close(gate)
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table+` WHERE seq < 0`) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table+` WHERE key = 'k1'`) == 4 }, 10*time.Second, 10*time.Millisecond)
	_, err = c.Retract(context.Background(), k0)
	require.NoError(t, err)
	_, err = c.Ingest(context.Background(), k0)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 1, count(t, `SELECT count(*) FROM `+table+` WHERE key = 'k0' AND seq = -2`), "k0 seq 2 undone once")
	require.Equal(t, 0, count(t, `SELECT count(*) FROM `+table+` WHERE key = 'k0' AND seq IN (3, 4)`), "retracted before running: never ran (the running one rolled back)")
	require.Equal(t, 3, count(t, `SELECT count(*) FROM `+table+` WHERE key = 'k0'`), "k0: seq 1, seq 2 and its undoing")
}

// claimCounter counts the rows ClaimInbox hands out.
type claimCounter struct {
	*ferrypg.Driver[pgx.Tx]
	rows atomic.Int64
}

func (c *claimCounter) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	rows, err := c.Driver.ClaimInbox(ctx, p)
	c.rows.Add(int64(len(rows)))
	return rows, err
}

// An event delivered to a running consumer with free workers, of a key
// with nothing to do, is claimed by the statement that records it
// (ferrydriver.InboxIngestClaimer) and runs at once: no claim hands it
// out. What the ingest could not claim (a key with an event waiting)
// goes through claims, in key order.
func TestConsumerRunsWhatItsIngestClaimed(t *testing.T) {
	t.Parallel()
	drv := &claimCounter{Driver: newPG(t)}
	table := effects(t, drv.Driver)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Workers: 4})
	require.NoError(t, err)
	release := make(chan struct{})
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		if ev.Key == "slow" {
			<-release
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	startConsumer(t, c)
	ctx := context.Background()
	warmUp(t, c, table)
	drv.rows.Store(0)
	evs := events(5, 5)
	for i, ev := range evs {
		n, err := c.Ingest(ctx, []*ferry.Event{ev})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) == i+2 }, 30*time.Second, 5*time.Millisecond)
	}
	require.Equal(t, int64(0), drv.rows.Load(), "every event was claimed by its ingest")
	require.Equal(t, 6, count(t, `SELECT count(DISTINCT event_id) FROM `+table))

	// A key whose event is running: its next event waits for a claim.
	slow1, slow2 := events(1, 1)[0], events(1, 1)[0]
	slow1.Key, slow2.Key = "slow", "slow"
	_, err = c.Ingest(ctx, []*ferry.Event{slow1})
	require.NoError(t, err)
	_, err = c.Ingest(ctx, []*ferry.Event{slow2})
	require.NoError(t, err)
	close(release)
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) == 8 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(1), drv.rows.Load(), "the key's second event was handed out by a claim")
	var first, second int
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx, `SELECT min(n) FILTER (WHERE event_id = $1), min(n) FILTER (WHERE event_id = $2) FROM `+table, slow1.ID, slow2.ID).Scan(&first, &second))
	require.Less(t, first, second, "in key order")
}

// The events a claim or an ingest handed out run in as few transactions
// as keep each one's handlers within a transaction's own cost (what the
// consumer has learnt its transactions cost): fast handlers share one
// transaction, slow ones get a worker each.
func TestConsumerBatchesFastHandlersTogether(t *testing.T) {
	t.Parallel()
	drv := &claimCounter{Driver: newPG(t)}
	table := effects(t, drv.Driver)
	_, err := ferrypgtest.Pool(t).Exec(context.Background(), `ALTER TABLE `+table+` ADD COLUMN tx xid8 NOT NULL DEFAULT pg_current_xact_id()`)
	require.NoError(t, err)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Workers: 8, BatchSize: 32})
	require.NoError(t, err)
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	startConsumer(t, c)
	ctx := context.Background()
	warmUp(t, c, table)

	// The slow claim first: it spreads over the free workers, and only
	// the warm-up's may still be taken.
	for _, tc := range []struct {
		name            string
		ingest          bool // the ingest claims (else a claim, woken)
		perEvent, perTx time.Duration
		txs             int
	}{
		{"claim-slow", false, time.Second, time.Millisecond, 6},
		{"claim-fast", false, 100 * time.Microsecond, 5 * time.Millisecond, 1},
		{"ingest-fast", true, 100 * time.Microsecond, 5 * time.Millisecond, 1},
		{"ingest-slow", true, time.Second, time.Millisecond, 6},
	} {
		ferry.SetTxCosts(c, "OrderPlaced", tc.perEvent, tc.perTx)
		drv.rows.Store(0)
		evs := events(6, 6)
		for _, ev := range evs {
			ev.Key = tc.name + "-" + ev.Key
		}
		claimed := int64(6)
		if tc.ingest {
			n, err := c.Ingest(ctx, evs)
			require.NoError(t, err)
			require.Equal(t, 6, n, "%s: the ingest claimed every event", tc.name)
			claimed = 0
		} else {
			_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "billing", Events: evs})
			require.NoError(t, err)
			c.Notify()
		}
		ids := make([]uuid.UUID, len(evs))
		for i, ev := range evs {
			ids[i] = ev.ID
		}
		require.Eventually(t, func() bool {
			return count(t, `SELECT count(*) FROM `+table+` WHERE event_id = ANY ($1)`, ids) == 6
		}, 30*time.Second, 5*time.Millisecond)
		require.Equal(t, tc.txs, count(t, `SELECT count(DISTINCT tx) FROM `+table+` WHERE event_id = ANY ($1)`, ids), tc.name)
		require.Equal(t, claimed, drv.rows.Load(), "%s: events handed out by claims", tc.name)
	}
}

// cancelledReply is a driver whose ingest claims commit and whose caller's
// context is cancelled before the reply is read: pgx then fails the call,
// as a source stopping mid-delivery makes it.
type cancelledReply struct {
	*ferrypg.Driver[pgx.Tx]
	cancel context.CancelFunc
}

func (d *cancelledReply) InsertInboxClaim(ctx context.Context, p *ferrydriver.InsertInboxParams, cp *ferrydriver.IngestClaimParams) ([]bool, []*ferrydriver.InboxRow, error) {
	res, rows, err := d.Driver.InsertInboxClaim(ctx, p, cp)
	d.cancel()
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	return res, rows, err
}

// An Ingest whose caller gives up while its claiming statement commits
// (ferrychain's source does when its node's subscription drops) still
// runs what it claimed: nothing else would before the claim expired.
func TestConsumerIngestCancelledAsItsClaimCommitsRunsWhatItClaimed(t *testing.T) {
	t.Parallel()
	drv := &cancelledReply{Driver: newPG(t)}
	table := effects(t, drv.Driver)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Workers: 2, ClaimTTL: time.Hour})
	require.NoError(t, err)
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
		return err
	})
	startConsumer(t, c)
	// Once Run runs (a first event applied), an ingest claims its event.
	drv.cancel = func() {}
	_, err = c.Ingest(context.Background(), events(1, 1))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table) == 1 }, 30*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	drv.cancel = cancel
	ev := events(1, 1)[0]
	n, err := c.Ingest(ctx, []*ferry.Event{ev})
	require.NoError(t, err, "the events are recorded: the source may acknowledge them")
	require.Equal(t, 1, n)
	require.Eventually(t, func() bool {
		return count(t, `SELECT count(*) FROM `+table+` WHERE event_id = '`+ev.ID.String()+`'`) == 1
	}, 30*time.Second, 5*time.Millisecond, "the claimed event ran, not an hour later")
}

// An event its ingest claimed that waits for a worker past a batch's
// budget (the handlers ahead of it run long) is given back, not counted,
// and runs through a claim with a claim's whole time: started on what was
// left of its first claim's, it would run out of time, its attempt
// charged.
func TestConsumerIngestClaimThatWaitedForAWorkerIsGivenBack(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Workers: 2, ClaimTTL: 4 * time.Second, MaxAttempts: 5})
	require.NoError(t, err)
	release := make(chan struct{})
	var released atomic.Bool
	running := make(chan string, 10)
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		if ev.Key == "warm" {
			return nil
		}
		if !released.Load() { // called early: holds its worker until the release
			running <- ev.Key
			<-release
			return nil
		}
		select { // called late: needs a second, more than a late start leaves it
		case <-time.After(time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	startConsumer(t, c)
	ctx := context.Background()
	ingest := func(keys ...string) []*ferry.Event {
		evs := events(len(keys), 1)
		for i, k := range keys {
			evs[i].Key = k
		}
		_, err := c.Ingest(ctx, evs)
		require.NoError(t, err)
		return evs
	}
	warm := ingest("warm")[0]
	require.Eventually(t, func() bool { return state(t, drv, warm.ID) == ferrydriver.InboxProcessed }, 30*time.Second, 5*time.Millisecond)
	hold := ingest("hold")[0] // takes a worker
	require.Equal(t, "hold", <-running)
	// One delivery of two idle keys, both claimed by it: one takes the
	// other worker, the other waits for one until the release.
	xy := ingest("x", "y")
	<-running
	time.Sleep(3 * time.Second) // past the budget, and most of the claim's time
	released.Store(true)
	close(release)
	all := []uuid.UUID{hold.ID, xy[0].ID, xy[1].ID}
	require.Eventually(t, func() bool {
		for _, id := range all {
			if state(t, drv, id) != ferrydriver.InboxProcessed {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond)
	st, err := drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: "billing", EventIDs: all})
	require.NoError(t, err)
	for _, id := range all {
		require.Equal(t, 1, st[id].Attempts, "given back uncounted, then run once: %s", st[id].LastError)
	}
}

func state(t *testing.T, drv *ferrypg.Driver[pgx.Tx], id uuid.UUID) ferrydriver.InboxState {
	st, err := drv.InboxStates(context.Background(), &ferrydriver.InboxIDsParams{Group: "billing", EventIDs: []uuid.UUID{id}})
	require.NoError(t, err)
	if st[id] == nil {
		return ""
	}
	return st[id].State
}
