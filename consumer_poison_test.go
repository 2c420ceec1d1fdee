package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryshared/childtest"
)

// The poison test runs this test binary again as the consumer child
// (FERRY_TEST_POISON_CHILD=<schema>:<hold|continue>:<batch size>); the child SIGKILLs
// itself whenever it handles the poison event.
func init() {
	if spec := os.Getenv("FERRY_TEST_POISON_CHILD"); spec != "" {
		parts := strings.Split(spec, ":")
		batch, _ := strconv.Atoi(parts[2])
		os.Exit(poisonChild(parts[0], parts[1], batch))
	}
}

const poisonMaxAttempts = 3

func poisonChild(schema, policy string, batch int) int {
	return runConsumerChild(schema, func(pool *pgxpool.Pool, drv *ferrypg.Driver[pgx.Tx]) (*ferry.Consumer[pgx.Tx], error) {
		effects := pgx.Identifier{schema, "effects"}.Sanitize()
		deadCalls := pgx.Identifier{schema, "dead_calls"}.Sanitize()
		dp := ferry.Hold
		if policy == "continue" {
			dp = ferry.Continue
		}
		c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "poison", Workers: 4, BatchSize: batch, ClaimTTL: time.Second,
			PollInterval: 20 * time.Millisecond, MaxAttempts: poisonMaxAttempts, DeadPolicy: dp,
			OnDead: func(ctx context.Context, d *ferry.DeadEvent) {
				if _, err := pool.Exec(ctx, `INSERT INTO `+deadCalls+` (event_id, attempts, reason) VALUES ($1, $2, $3)`, d.Event.ID, d.Attempts, d.Err.Error()); err != nil {
					fmt.Fprintln(os.Stderr, "record OnDead:", err)
				}
			}})
		if err != nil {
			return nil, err
		}
		c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
			if ev.Type == "Poison" {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL) // the event crashes the process, every time
				select {}
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
			return err
		})
		return c, nil
	})
}

// TestPoisonEventThatKillsTheConsumer: an event whose handler crashes the
// process every time goes DEAD after MaxAttempts crashes (the attempts are
// counted even when its process crashes), OnDead fires once, its key's later events follow
// the policy, and every other key's events are applied exactly once.
func TestPoisonEventThatKillsTheConsumer(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"hold", "continue"} {
		for _, batch := range []int{1, 32} {
			t.Run(fmt.Sprintf("%s/BatchSize%d", policy, batch), func(t *testing.T) {
				t.Parallel()
				testPoisonKills(t, policy, batch)
			})
		}
	}
}

// testPoisonKills: in batches, the poison's crash takes its batch with it
// (nothing of it applied); those events run again, each alone.
func testPoisonKills(t *testing.T, policy string, batch int) {
	drv := newPG(t)
	table := effects(t, drv)
	deadCalls := pgx.Identifier{drv.Schema(), "dead_calls"}.Sanitize()
	_, err := ferrypgtest.Pool(t).Exec(context.Background(), `CREATE TABLE `+deadCalls+` (event_id uuid NOT NULL, attempts int NOT NULL, reason text NOT NULL)`)
	require.NoError(t, err)

	ingester, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "poison"})
	require.NoError(t, err)
	others := events(2000, 40)
	poison := &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: "poisoned", Type: "Poison", Seq: 1, Payload: []byte(`{}`), CreatedAt: time.Now()}
	behind := []*ferry.Event{
		{ID: ferry.NewID(), Topic: "orders", Key: "poisoned", Type: "OrderPlaced", Seq: 2, Payload: []byte(`{}`), CreatedAt: time.Now()},
		{ID: ferry.NewID(), Topic: "orders", Key: "poisoned", Type: "OrderPlaced", Seq: 3, Payload: []byte(`{}`), CreatedAt: time.Now()},
	}
	ctx := context.Background()
	_, err = ingester.Ingest(ctx, append(append([]*ferry.Event{poison}, behind...), others[:1000]...))
	require.NoError(t, err)

	start := func() *exec.Cmd {
		return childtest.Start(t, "FERRY_TEST_POISON_CHILD="+drv.Schema()+":"+policy+":"+strconv.Itoa(batch))
	}
	// Restart the consumer whenever the poison kills it, as a supervisor
	// would, until a child finds the event DEAD and carries on; the rest
	// keeps arriving meanwhile.
	kills := 0
	inbox := pgx.Identifier{drv.Schema(), "inbox"}.Sanitize()
	isDead := func() bool {
		return count(t, `SELECT count(*) FROM `+inbox+` WHERE event_id = $1 AND state = 'dead'`, poison.ID) == 1
	}
	var child *exec.Cmd
	var exited chan error
	for deadline := time.Now().Add(2 * time.Minute); ; {
		require.True(t, time.Now().Before(deadline), "the poison event never went DEAD (%d kills)", kills)
		child = start()
		exited = make(chan error, 1)
		go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(child, exited)
		var err error
		select {
		case err = <-exited:
		case <-waitFor(t, isDead):
			select {
			case err = <-exited: // killed just before
			case <-time.After(500 * time.Millisecond):
			}
		}
		if err == nil && isDead() {
			break // this child gave the event up and runs on
		}
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "the child ends only when the poison kills it")
		require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())
		kills++
		if kills == 1 {
			_, err = ingester.Ingest(ctx, others[1000:])
			require.NoError(t, err)
		}
		require.LessOrEqual(t, kills, poisonMaxAttempts, "claimed again after its attempts were exhausted")
	}
	require.Equal(t, poisonMaxAttempts, kills, "one crash per attempt")
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table+` WHERE key <> 'poisoned'`) >= len(others) }, time.Minute, 50*time.Millisecond,
		"other keys' events applied: %d of %d", count(t, `SELECT count(*) FROM `+table+` WHERE key <> 'poisoned'`), len(others))
	require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+deadCalls) >= 1 }, 30*time.Second, 20*time.Millisecond)
	if policy == "continue" {
		require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM `+table+` WHERE key = 'poisoned'`) == len(behind) },
			30*time.Second, 20*time.Millisecond, "Continue: the key's later events run")
	} else {
		time.Sleep(1500 * time.Millisecond)
		require.Zero(t, count(t, `SELECT count(*) FROM `+table+` WHERE key = 'poisoned'`), "Hold: the key's later events wait")
	}
	require.NoError(t, child.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-exited)

	require.Equal(t, 1, count(t, `SELECT count(*) FROM `+deadCalls), "OnDead fired once")
	var attempts int
	var reason string
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx, `SELECT attempts, reason FROM `+deadCalls).Scan(&attempts, &reason))
	require.Equal(t, poisonMaxAttempts, attempts)
	require.Contains(t, reason, "attempts exhausted; the last ones lost their claim or crashed the process")
	n := len(others)
	if policy == "continue" {
		n += len(behind)
	}
	summary := func() string {
		rows, err := ferrypgtest.Pool(t).Query(ctx, `SELECT state || ' ' || type || ' attempts=' || attempts || ' x' || count(*) || COALESCE(' ' || min(last_error), '')
			FROM `+inbox+` GROUP BY state, type, attempts ORDER BY 1`)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "; ")
	}
	require.Equal(t, n, count(t, `SELECT count(*) FROM `+table), "no effect applied twice, none lost; inbox: %s", summary())
	require.Equal(t, n, count(t, `SELECT count(DISTINCT event_id) FROM `+table))
	require.Zero(t, count(t, `SELECT count(*) FROM (
		SELECT seq - lag(seq, 1, 0::bigint) OVER (PARTITION BY key ORDER BY n) AS step FROM `+table+` WHERE key <> 'poisoned') s WHERE step <> 1`),
		"each other key applied in order, without gaps")
	t.Logf("%s: the poison event killed the consumer %d times, then went DEAD; %d other events applied once each", policy, kills, len(others))
}

// waitFor returns a channel closed once cond holds (checked every 20 ms,
// for at most two minutes).
func waitFor(t *testing.T, cond func() bool) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for end := time.Now().Add(2 * time.Minute); time.Now().Before(end) && !cond(); {
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return done
}

// TestStaleAttemptCannotFinishALaterOne: attempt 1 outlives its claim and
// fails late, while attempt 2 of the same process, claimed after the
// first expired, succeeds. The late failure is fenced off by attempt 2's
// claim token: the event is processed once, with two attempts, and never
// DEAD.
func TestStaleAttemptCannotFinishALaterOne(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	table := effects(t, drv)
	var deaths atomic.Int32
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "stale", Workers: 4, ClaimTTL: time.Second, MaxAttempts: 2,
		PollInterval: 20 * time.Millisecond, OnDead: func(context.Context, *ferry.DeadEvent) { deaths.Add(1) }})
	require.NoError(t, err)
	var attempts atomic.Int32
	lateFailure := make(chan struct{})
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		if _, err := tx.Exec(context.WithoutCancel(ctx), `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq); err != nil {
			return err
		}
		if attempts.Add(1) == 1 {
			time.Sleep(2500 * time.Millisecond) // ignores its deadline, past the claim and the rescue's wait
			defer close(lateFailure)
			return errors.New("late failure of attempt 1")
		}
		return nil
	})
	startConsumer(t, c)
	ev := events(1, 1)[0]
	_, err = c.Ingest(context.Background(), []*ferry.Event{ev})
	require.NoError(t, err)
	<-lateFailure
	inbox := pgx.Identifier{drv.Schema(), "inbox"}.Sanitize()
	require.Eventually(t, func() bool {
		return count(t, `SELECT count(*) FROM `+inbox+` WHERE event_id = $1 AND state = 'processed'`, ev.ID) == 1
	}, 30*time.Second, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond) // anything late would land now
	require.Equal(t, 1, count(t, `SELECT count(*) FROM `+table), "processed once")
	require.Equal(t, 2, count(t, `SELECT attempts FROM `+inbox+` WHERE event_id = $1`, ev.ID), "two attempts recorded")
	require.Equal(t, "processed", func() string {
		var s string
		require.NoError(t, ferrypgtest.Pool(t).QueryRow(context.Background(), `SELECT state FROM `+inbox+` WHERE event_id = $1`, ev.ID).Scan(&s))
		return s
	}())
	require.Equal(t, int32(2), attempts.Load())
	require.Zero(t, deaths.Load(), "never DEAD")
}
