package ferrymysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/childtest"
)

// The consumer crash test runs this test binary again as the consumer
// child (FERRY_TEST_MYSQL_CONSUMER_CHILD=<dsn>) and SIGKILLs it at random.
func init() {
	if dsn := os.Getenv("FERRY_TEST_MYSQL_CONSUMER_CHILD"); dsn != "" {
		os.Exit(consumerChild(dsn))
	}
}

// consumerChild consumes group "crash" of dsn's database, each event's
// effect a row of crash_effects in the handler's transaction, until
// SIGTERM.
func consumerChild(dsn string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	childtest.SignalReady()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	drv, err := ferrymysql.Open(dsn, nil)
	if err != nil {
		return fail(err)
	}
	defer drv.Close()
	batch, _ := strconv.Atoi(os.Getenv("FERRY_TEST_MYSQL_CONSUMER_BATCH"))
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "crash", Workers: 8, BatchSize: batch, ClaimTTL: time.Second, PollInterval: 20 * time.Millisecond})
	if err != nil {
		return fail(err)
	}
	c.HandleAll(func(ctx context.Context, tx *sql.Tx, ev *ferry.Event) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO crash_effects (event_id, k, seq) VALUES (?, ?, ?)`, ev.ID[:], ev.Key, ev.Seq); err != nil {
			return err
		}
		if rand.IntN(10) == 0 {
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // SIGKILLs land mid-handler too
		}
		return nil
	})
	if err := c.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// TestConsumerCrash: a consumer process SIGKILLed at random moments while
// events arrive (20,000; 4,000 with -short) loses none, applies none twice
// and keeps each key's order, one event per transaction and in batches (a
// SIGKILL mid-batch leaves nothing of it applied, and its events run
// again).
func TestConsumerCrash(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 32} {
		t.Run(fmt.Sprintf("BatchSize%d", batch), func(t *testing.T) {
			t.Parallel()
			testConsumerCrash(t, batch)
		})
	}
}

func testConsumerCrash(t *testing.T, batch int) {
	n, kills := 20000, 20
	if testing.Short() {
		n, kills = 4000, 8
	}
	dsn := mysqltest.Database(t)
	drv := mysqltest.Open(t, dsn, nil, true)
	_, err := drv.DB().Exec(`CREATE TABLE crash_effects (n BIGINT AUTO_INCREMENT PRIMARY KEY, event_id BINARY(16) NOT NULL, k VARBINARY(255) NOT NULL, seq BIGINT NOT NULL) ENGINE=InnoDB`)
	require.NoError(t, err)
	ingester, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "crash"})
	require.NoError(t, err)
	evs := make([]*ferryevent.Event, n)
	seq := map[string]int64{}
	for i := range evs {
		k := "k" + strconv.Itoa(i%500)
		seq[k]++
		evs[i] = ferrydrivertest.Event("t", k, strconv.Itoa(i))
		evs[i].Seq = seq[k]
	}
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
	count := func(q string) int {
		var v int
		require.NoError(t, drv.DB().QueryRow(q).Scan(&v), q)
		return v
	}
	start := func() *exec.Cmd {
		return childtest.Start(t, "FERRY_TEST_MYSQL_CONSUMER_CHILD="+dsn, "FERRY_TEST_MYSQL_CONSUMER_BATCH="+strconv.Itoa(batch))
	}
	child := childtest.KillRepeatedly(t, kills, start)
	require.NoError(t, <-ingested)
	require.Eventually(t, func() bool { return count(`SELECT COUNT(DISTINCT event_id) FROM crash_effects`) >= n }, 3*time.Minute, 100*time.Millisecond)
	require.NoError(t, child.Process.Signal(syscall.SIGTERM))
	require.NoError(t, child.Wait())

	require.Equal(t, n, count(`SELECT COUNT(*) FROM crash_effects`), "no effect applied twice")
	require.Zero(t, count(`SELECT COUNT(*) FROM (
		SELECT seq - COALESCE(LAG(seq) OVER (PARTITION BY k ORDER BY n), 0) AS step FROM crash_effects) s WHERE step <> 1`), "each key applied in order, without gaps")
	require.Equal(t, n, count(`SELECT COUNT(*) FROM ferry_inbox WHERE state = 'processed'`), "every event processed")
	t.Logf("batch size %d: %d events over 500 keys, %d SIGKILLs: %d effects, none twice, keys in order", batch, n, kills, n)
}
