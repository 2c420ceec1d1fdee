package ferry_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryshared/childtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The consumer crash test runs this test binary again as the consumer
// child (FERRY_TEST_CONSUMER_CHILD=<schema>) and SIGKILLs it at random.
func init() {
	if schema := os.Getenv("FERRY_TEST_CONSUMER_CHILD"); schema != "" {
		os.Exit(consumerChild(schema))
	}
}

func consumerChild(schema string) int {
	return runConsumerChild(schema, func(_ *pgxpool.Pool, drv *ferrypg.Driver[pgx.Tx]) (*ferry.Consumer[pgx.Tx], error) {
		table := pgx.Identifier{schema, "effects"}.Sanitize()
		batch, _ := strconv.Atoi(os.Getenv("FERRY_TEST_CONSUMER_BATCH"))
		c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "crash", Workers: 8, BatchSize: batch, ClaimTTL: time.Second, PollInterval: 20 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq); err != nil {
				return err
			}
			if rand.IntN(10) == 0 {
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // SIGKILLs land mid-handler too
			}
			return nil
		})
		return c, nil
	})
}

// runConsumerChild is the body of a consumer child process: it opens the
// driver of schema, has newConsumer make the consumer (and register its
// handlers), runs it until SIGTERM and returns the exit code.
func runConsumerChild(schema string, newConsumer func(pool *pgxpool.Pool, drv *ferrypg.Driver[pgx.Tx]) (*ferry.Consumer[pgx.Tx], error)) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	childtest.SignalReady()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool, err := pgxpool.New(ctx, ferrypgtest.URL())
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema})
	if err != nil {
		return fail(err)
	}
	c, err := newConsumer(pool, drv)
	if err != nil {
		return fail(err)
	}
	if err := c.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// TestConsumerCrash: a consumer process SIGKILLed at random moments while
// 20,000 events arrive loses none, applies none twice and keeps each key's
// order.
func TestConsumerCrash(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 32} {
		t.Run(fmt.Sprintf("BatchSize%d", batch), func(t *testing.T) {
			t.Parallel()
			testConsumerCrash(t, batch)
		})
	}
}

// testConsumerCrash: with batches, a SIGKILL mid-batch leaves nothing of
// it applied (one transaction), and its events run again.
func testConsumerCrash(t *testing.T, batch int) {
	n, kills := 20000, 20
	if testing.Short() {
		n, kills = 4000, 8
	}
	drv := newPG(t)
	table := effects(t, drv)
	ingester, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "crash"})
	require.NoError(t, err)
	evs := events(n, 500)
	ingested := make(chan error, 1)
	go func() {
		for i := 0; i < n; i += 250 {
			if _, err := ingester.Ingest(context.Background(), evs[i:i+250]); err != nil {
				ingested <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		ingested <- nil
	}()

	start := func() *exec.Cmd {
		return childtest.Start(t, "FERRY_TEST_CONSUMER_CHILD="+drv.Schema(), "FERRY_TEST_CONSUMER_BATCH="+strconv.Itoa(batch))
	}
	child := childtest.KillRepeatedly(t, kills, start)
	require.NoError(t, <-ingested)
	require.Eventually(t, func() bool { return count(t, `SELECT count(DISTINCT event_id) FROM `+table) >= n }, 3*time.Minute, 100*time.Millisecond)
	require.NoError(t, child.Process.Signal(syscall.SIGTERM))
	require.NoError(t, child.Wait())

	require.Equal(t, n, count(t, `SELECT count(*) FROM `+table), "no effect applied twice")
	require.Zero(t, count(t, `SELECT count(*) FROM (
		SELECT seq - lag(seq, 1, 0::bigint) OVER (PARTITION BY key ORDER BY n) AS step FROM `+table+`) s WHERE step <> 1`), "each key applied in order, without gaps")
	inbox := pgx.Identifier{drv.Schema(), "inbox"}.Sanitize()
	require.Equal(t, n, count(t, `SELECT count(*) FROM `+inbox+` WHERE state = 'processed'`), "every event processed")
	t.Logf("batch size %d: %d events over 500 keys, %d SIGKILLs: %d effects, none twice, keys in order", batch, n, kills, n)
}
