package ferrymysql_test

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
	"github.com/ferry-dev/ferry/ferryevent"
)

// claimOne inserts an event for group "g" and claims it.
func claimOne(ctx context.Context, t testing.TB, drv *ferrymysql.Driver, payload string) *ferrydriver.InboxRow {
	t.Helper()
	ev := ferrydrivertest.Event("t", "k-"+payload, payload)
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{ev}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 10, TTL: time.Minute})
	require.NoError(t, err)
	i := slices.IndexFunc(rows, func(r *ferrydriver.InboxRow) bool { return r.Event.ID == ev.ID })
	require.GreaterOrEqual(t, i, 0, "claimed")
	return rows[i]
}

func completeRow(ctx context.Context, t testing.TB, drv *ferrymysql.Driver, row *ferrydriver.InboxRow) {
	t.Helper()
	require.NoError(t, drv.RunInTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: row.Event.ID, Claim: row.Claim})
	}))
}

// awaitSubscribed waits until n AwaitSettled calls wait (past their
// first read: only the binlog or the safety net can wake them now) and
// the binlog reader runs.
func awaitSubscribed(t testing.TB, drv *ferrymysql.Driver, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		w, running := drv.SettleWaiters()
		return w == n && running
	}, 10*time.Second, time.Millisecond)
}

// TestAwaitSettledThroughACallersSnapshot is the dispatch gate of seed-002:
// a request's REPEATABLE READ transaction, whose snapshot was taken while
// the consumer still ran the event, asks whether the event settled. Its
// own reads still see the event running; AwaitSettled, called in the
// middle of that transaction, is woken by the consumer's commit (the
// binlog, not its safety net) and answers settled; asked again after the
// commit, it answers at once.
func TestAwaitSettledThroughACallersSnapshot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	row := claimOne(ctx, t, drv, "gate")

	caller, err := drv.DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, err)
	defer func() { _ = caller.Rollback() }()
	seen := func() string {
		var st string
		require.NoError(t, caller.QueryRowContext(ctx, `SELECT state FROM ferry_inbox WHERE event_id = ?`, row.Event.ID[:]).Scan(&st))
		return st
	}
	require.Equal(t, "pending", seen(), "the caller's snapshot is taken while the event runs (claimed on its key, the row unfinished)")

	type result struct {
		st  map[uuid.UUID]*ferrydriver.InboxRow
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{row.Event.ID}, Deadline: time.Now().Add(30 * time.Second)})
		done <- result{st, err}
	}()
	awaitSubscribed(t, drv, 1)
	notes := drv.SettleNotes()
	completeRow(ctx, t, drv, row)
	got := <-done
	require.NoError(t, got.err)
	require.Equal(t, ferrydriver.InboxProcessed, got.st[row.Event.ID].State, "settled, although the caller's snapshot predates the commit")
	require.Greater(t, drv.SettleNotes(), notes, "woken by the binlog reader")
	require.Equal(t, "pending", seen(), "the caller's own snapshot still shows the event unfinished: AwaitSettled did not read through it")

	// The gate asked again inside the same transaction, after the commit.
	st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{row.Event.ID}, Deadline: time.Now().Add(30 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessed, st[row.Event.ID].State)
	require.NoError(t, caller.Rollback())
}

// TestAwaitSettledWokenByEachOutcome: a waiter for several events is woken
// by each finish (processed, dead, retracted, discarded), of events
// finished by other drivers over the same database, and returns once all
// are; an unrelated group's commits do not end its wait.
func TestAwaitSettledWokenByEachOutcome(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	other := mysqltestOpen(t, drv)
	a, b, c := claimOne(ctx, t, other, "a"), claimOne(ctx, t, other, "b"), claimOne(ctx, t, other, "c")
	ids := []uuid.UUID{a.Event.ID, b.Event.ID, c.Event.ID}
	done := make(chan map[uuid.UUID]*ferrydriver.InboxRow, 1)
	go func() {
		st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: ids, Deadline: time.Now().Add(30 * time.Second)})
		require.NoError(t, err)
		done <- st
	}()
	awaitSubscribed(t, drv, 1)
	completeRow(ctx, t, other, a)
	require.NoError(t, other.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "g", EventID: b.Event.ID, Claim: b.Claim, Error: "rejected", Dead: true}))
	select {
	case <-done:
		t.Fatal("returned with c still running")
	case <-time.After(100 * time.Millisecond):
	}
	_, err := other.RetractInbox(ctx, &ferrydriver.RetractInboxParams{Group: "g", Retractions: []ferrydriver.Retraction{{Event: &c.Event}}})
	require.NoError(t, err)
	st := <-done
	require.Equal(t, ferrydriver.InboxProcessed, st[a.Event.ID].State)
	require.Equal(t, ferrydriver.InboxDead, st[b.Event.ID].State)
	require.Equal(t, "rejected", st[b.Event.ID].LastError)
	require.Equal(t, ferrydriver.InboxRetracted, st[c.Event.ID].State)
}

// mysqltestOpen opens another driver over drv's database.
func mysqltestOpen(t *testing.T, drv *ferrymysql.Driver) *ferrymysql.Driver {
	t.Helper()
	other, err := ferrymysql.New(drv.DB(), &ferrymysql.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	return other
}

// BenchmarkSettleWakeUp measures how long AwaitSettled takes to return
// after the commit that finishes its event (RunInTx returned): the
// binlog's wake-up and the waiter's read. It reports the median and the
// 99th percentile in microseconds.
func BenchmarkSettleWakeUp(b *testing.B) {
	ctx := context.Background()
	drv := mysqltest.Driver(b, &ferrymysql.Config{})
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		row := claimOne(ctx, b, drv, "e"+strconv.Itoa(i))
		done := make(chan time.Time, 1)
		go func() {
			st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{row.Event.ID}, Deadline: time.Now().Add(30 * time.Second)})
			if err != nil || st[row.Event.ID].State != ferrydriver.InboxProcessed {
				b.Errorf("AwaitSettled: %v %+v", err, st[row.Event.ID])
			}
			done <- time.Now()
		}()
		awaitSubscribed(b, drv, 1)
		b.StartTimer()
		completeRow(ctx, b, drv, row)
		committed := time.Now()
		lat = append(lat, (<-done).Sub(committed))
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// TestSettlementReaderFollowsItsWaiters: the binlog reader starts with the
// first waiter, outlives the last by a few seconds, then stops, and starts
// again with the next waiter, which it wakes.
func TestSettlementReaderFollowsItsWaiters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	_, running := drv.SettleWaiters()
	require.False(t, running, "no reader before a waiter")
	row := claimOne(ctx, t, drv, "first")
	completeRow(ctx, t, drv, row)
	st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{row.Event.ID}, Deadline: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessed, st[row.Event.ID].State, "settled already: answered at once")
	waiters, running := drv.SettleWaiters()
	require.Equal(t, 0, waiters)
	require.True(t, running, "the reader outlives its last waiter for a while")
	require.Eventually(t, func() bool { _, running := drv.SettleWaiters(); return !running }, 20*time.Second, 50*time.Millisecond,
		"and then stops")

	next := claimOne(ctx, t, drv, "next")
	done := make(chan ferrydriver.InboxState, 1)
	go func() {
		st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{next.Event.ID}, Deadline: time.Now().Add(time.Minute)})
		if err != nil {
			t.Error(err)
		}
		done <- st[next.Event.ID].State
	}()
	awaitSubscribed(t, drv, 1)
	notes := drv.SettleNotes()
	completeRow(ctx, t, drv, next)
	require.Equal(t, ferrydriver.InboxProcessed, <-done)
	require.Greater(t, drv.SettleNotes(), notes, "woken by the restarted reader")
}

// TestAwaitSettledWithoutTheBinlog: a driver that cannot read the binlog
// (no DSN here; no grant or no binlog elsewhere) still settles, by its
// safety net's reads.
func TestAwaitSettledWithoutTheBinlog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := mysqltestOpen(t, newDriver(t, nil)) // no Config.DSN
	row := claimOne(ctx, t, drv, "blind")
	done := make(chan ferrydriver.InboxState, 1)
	go func() {
		st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: []uuid.UUID{row.Event.ID}, Deadline: time.Now().Add(time.Minute)})
		if err != nil {
			t.Error(err)
		}
		done <- st[row.Event.ID].State
	}()
	require.Eventually(t, func() bool { w, _ := drv.SettleWaiters(); return w == 1 }, 10*time.Second, time.Millisecond)
	completeRow(ctx, t, drv, row)
	require.Equal(t, ferrydriver.InboxProcessed, <-done)
	_, running := drv.SettleWaiters()
	require.False(t, running)
	require.Zero(t, drv.SettleNotes())
}
