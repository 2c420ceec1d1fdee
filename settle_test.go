package ferry_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// The seed-002 incident: a request commits an order; its gate then asks
// whether the order was accepted by the ledger consumer. Asked right after
// the commit, "is it done?" is always no, so the gate waits for settlement
// with a deadline, from inside a REPEATABLE READ transaction whose snapshot
// predates the consumer's commit, and must still see that commit.
func TestAwaitSettledFromInsideARepeatableReadTransaction(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ledger, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "ledger", MaxAttempts: 1, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	ledger.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		time.Sleep(200 * time.Millisecond) // the ledger takes a moment
		if strings.Contains(string(ev.Payload), "overdrawn") {
			return errors.New("insufficient funds")
		}
		return nil
	})
	startConsumer(t, ledger)
	relay, err := ferry.NewRelay(drv, ledger.Sink(), &ferry.RelayConfig{Feed: "ledger", PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	run(t, relay)

	ctx := context.Background()
	place := func(payload string) uuid.UUID {
		ev := &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: "acct-1", Type: "OrderPlaced", Payload: []byte(payload)}
		require.NoError(t, pgx.BeginFunc(ctx, ferrypgtest.Pool(t), func(tx pgx.Tx) error { return client.EmitTx(ctx, tx, ev) }))
		return ev.ID
	}
	good := place(`{"amount":10}`)

	// The gate runs in a REPEATABLE READ transaction started before the
	// consumer could have committed.
	tx, err := ferrypgtest.Pool(t).BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one)) // the snapshot is taken now

	failed, err := ferry.Failed(ctx, drv, "ledger", good)
	require.NoError(t, err)
	require.Empty(t, failed, "right after the commit nothing has failed: the gate must not reject")

	reg := prometheus.NewRegistry()
	prom := ferryprom.New(reg)
	start := time.Now()
	s, err := ferry.AwaitSettled(ctx, drv, "ledger", []uuid.UUID{good}, 10*time.Second, prom)
	require.NoError(t, err)
	require.True(t, s.Done(), "settled, though the caller's snapshot predates the consumer's commit: %+v", s)
	t.Logf("settled after %v", time.Since(start).Round(time.Millisecond))

	bad := place(`{"amount":"overdrawn"}`)
	s, err = ferry.AwaitSettled(ctx, drv, "ledger", []uuid.UUID{bad}, 10*time.Second, prom)
	require.NoError(t, err)
	require.Contains(t, s.Failed[bad], "insufficient funds", "failed as soon as the event is dead")
	failed, err = ferry.Failed(ctx, drv, "ledger", good, bad)
	require.NoError(t, err)
	require.Equal(t, map[uuid.UUID]string{bad: failed[bad]}, failed)

	never := ferry.NewID()
	s, err = ferry.AwaitSettled(ctx, drv, "ledger", []uuid.UUID{never}, 300*time.Millisecond, prom)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{never}, s.Pending, "pending at the deadline")
	require.Equal(t, 3, testutil.CollectAndCount(reg, "ferry_settlement_wait_seconds"), "wait times by outcome: settled, failed, pending")
}
