package ferry_test

import (
	"context"
	"os"
	"os/exec"
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

// The recovery test runs this test binary again as consumer children
// (FERRY_TEST_RECOVERY_CHILD=<schema>), with the consumer's defaults
// (ClaimTTL 30 s, 8 workers, batches of 32).
func init() {
	if schema := os.Getenv("FERRY_TEST_RECOVERY_CHILD"); schema != "" {
		os.Exit(recoveryChild(schema))
	}
}

func recoveryChild(schema string) int {
	return runConsumerChild(schema, func(_ *pgxpool.Pool, drv *ferrypg.Driver[pgx.Tx]) (*ferry.Consumer[pgx.Tx], error) {
		table := pgx.Identifier{schema, "effects"}.Sanitize()
		c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "recovery", PollInterval: 20 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		pid := os.Getpid()
		c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
			time.Sleep(3 * time.Millisecond) // keeps claims in flight when the SIGKILL lands
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq, pid) VALUES ($1, $2, $3, $4)`, ev.ID, ev.Key, ev.Seq, pid)
			return err
		})
		return c, nil
	})
}

// TestConsumerRecoversFromSIGKILL: two consumer processes share a group
// with the default settings (ClaimTTL 30 s); one is SIGKILLed while both
// apply events. The survivor applies every event once, each key in order,
// and the keys the dead process had claimed run again before their
// claims' TTL would have ended (the dead process's membership lapses
// first). It logs the time from the SIGKILL to those keys applying again,
// the group's longest pause after it, and the time to apply everything.
func TestConsumerRecoversFromSIGKILL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newPG(t)
	table := pgx.Identifier{drv.Schema(), "effects"}.Sanitize()
	_, err := ferrypgtest.Pool(t).Exec(ctx, `CREATE TABLE `+table+` (
		n bigserial PRIMARY KEY, event_id uuid NOT NULL, key text NOT NULL, seq bigint NOT NULL, pid int NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	ingester, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "recovery"})
	require.NoError(t, err)
	const n, keys, chunk = 12000, 200, 100
	evs := events(n, keys)
	start := func() *exec.Cmd { return childtest.Start(t, "FERRY_TEST_RECOVERY_CHILD="+drv.Schema()) }
	a, b := start(), start()
	ingested := make(chan error, 1)
	go func() {
		for i := 0; i < n; i += chunk {
			if _, err := ingester.Ingest(ctx, evs[i:i+chunk]); err != nil {
				ingested <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		ingested <- nil
	}()
	// Both apply events, then a dies.
	require.Eventually(t, func() bool {
		return count(t, `SELECT count(*) FROM `+table+` WHERE pid = $1`, a.Process.Pid) >= 500 &&
			count(t, `SELECT count(*) FROM `+table+` WHERE pid = $1`, b.Process.Pid) >= 500
	}, time.Minute, 10*time.Millisecond)
	// The keys a holds claims on.
	claimedBy := func(pid int) []string {
		rows, err := ferrypgtest.Pool(t).Query(ctx, `SELECT key FROM `+pgx.Identifier{drv.Schema(), "inbox_keys"}.Sanitize()+`
			WHERE group_name = 'recovery' AND claim_token IS NOT NULL AND claimed_by LIKE '%-' || $1::text || '-%'`, strconv.Itoa(pid))
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return keys
	}
	// SIGKILL a while it holds claims; should it have finished them
	// between the look and the signal, another process takes its place
	// and is killed the same way.
	var held []string
	var killed, killedAt time.Time
	for victim, kills := a, 1; ; kills++ {
		require.Eventually(t, func() bool { return len(claimedBy(victim.Process.Pid)) > 0 }, time.Minute, time.Millisecond)
		require.NoError(t, victim.Process.Signal(syscall.SIGKILL))
		killed = time.Now()
		_ = victim.Wait()
		require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&killedAt))
		if held = claimedBy(victim.Process.Pid); len(held) > 0 {
			break
		}
		require.Less(t, kills, 5, "the killed processes never held claims when they died")
		victim = start()
	}
	require.NoError(t, <-ingested)
	require.Eventually(t, func() bool { return count(t, `SELECT count(DISTINCT event_id) FROM `+table) >= n }, 3*time.Minute, 50*time.Millisecond)
	all := time.Since(killed)

	seconds := func(q string, args ...any) time.Duration {
		var s float64
		require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx, `SELECT COALESCE(EXTRACT(EPOCH FROM (`+q+`)), -1)::float8`, args...).Scan(&s))
		return time.Duration(s * float64(time.Second))
	}
	// Its keys' first effects after the SIGKILL (by the survivor).
	heldBack := seconds(`SELECT max(first) - $2::timestamptz FROM (
		SELECT min(at) AS first FROM `+table+` WHERE key = ANY($1) AND at > $2::timestamptz GROUP BY key) s`, held, killedAt)
	firstOther := seconds(`SELECT min(at) - $2::timestamptz FROM `+table+` WHERE NOT key = ANY($1) AND at > $2::timestamptz`, held, killedAt)
	pause := seconds(`SELECT max(gap) FROM (
		SELECT at - lag(at, 1, $1::timestamptz) OVER (ORDER BY at) AS gap FROM `+table+` WHERE at > $1) s`, killedAt)
	var load string
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = string(b[:len(b)-1])
	}
	t.Logf("SIGKILL of one of two consumer processes holding claims on %d keys: other keys applied again after %v; the killed process's keys after %v (all of them); longest pause of the group %v; every event applied %v after the kill; load average %s",
		len(held), firstOther.Round(time.Millisecond), heldBack.Round(time.Millisecond), pause.Round(time.Millisecond), all.Round(time.Millisecond), load)

	require.NoError(t, b.Process.Signal(syscall.SIGTERM))
	require.NoError(t, b.Wait())
	require.Equal(t, n, count(t, `SELECT count(*) FROM `+table), "no effect applied twice")
	require.Zero(t, count(t, `SELECT count(*) FROM (
		SELECT seq - lag(seq, 1, 0::bigint) OVER (PARTITION BY key ORDER BY n) AS step FROM `+table+`) s WHERE step <> 1`), "each key applied in order, without gaps")
	require.Less(t, heldBack, 30*time.Second, "the killed process's keys waited for its claims' TTL (30 s)")
}
