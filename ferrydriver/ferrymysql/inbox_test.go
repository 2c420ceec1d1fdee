package ferrymysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// TestIngestersNeverDeadlock: eight ingesters of different events (IDs
// spread over the whole unique index, each ingester's keys its own, new
// keys in every batch, and half of each batch a redelivery of events it
// already inserted) run against four workers claiming, completing and
// failing rows. Every event is recorded once, and no transaction of the
// driver was ever a deadlock's victim, timed out on a lock, or met a
// duplicate key (Driver.Reruns).
func TestIngestersNeverDeadlock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	const ingesters, batches, perBatch = 8, 20, 20
	var wg sync.WaitGroup
	var inserted atomic.Int64
	for i := range ingesters {
		wg.Go(func() {
			var sent []*ferryevent.Event
			for b := range batches {
				var evs []*ferryevent.Event
				for j := range perBatch {
					key := fmt.Sprintf("i%d-k%d", i, j%7) // the ingester's usual keys
					if j%5 == 0 {
						key = fmt.Sprintf("i%d-new%d-%d", i, b, j) // and new ones
					}
					ev := ferrydrivertest.Event("t", key, strconv.Itoa(j))
					ev.ID = uuid.New() // random: inserts land all over the unique index
					evs = append(evs, ev)
				}
				// Half a batch again: redelivered events, read and skipped.
				if len(sent) >= perBatch/2 {
					evs = append(sent[len(sent)-perBatch/2:len(sent):len(sent)], evs...)
				}
				res, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: evs})
				if err != nil {
					t.Errorf("ingester %d: %v", i, err)
					return
				}
				for _, ok := range res {
					if ok {
						inserted.Add(1)
					}
				}
				sent = append(sent, evs[len(evs)-perBatch:]...)
			}
		})
	}
	stop := make(chan struct{})
	var workers sync.WaitGroup
	var processed atomic.Int64
	for w := range 4 {
		workers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w" + strconv.Itoa(w), Limit: 10, TTL: time.Minute})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				for n, r := range rows {
					if n%9 == 8 {
						err = drv.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "g", EventID: r.Event.ID, Claim: r.Claim, Error: "again", RetryAt: time.Now()})
					} else {
						err = drv.RunInTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
							return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: r.Event.ID, Claim: r.Claim})
						})
						processed.Add(1)
					}
					if err != nil {
						t.Errorf("finish: %v", err)
						return
					}
				}
				if len(rows) == 0 {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(ingesters*batches*perBatch), inserted.Load(), "each event recorded once")
	require.Eventually(t, func() bool { return processed.Load() == inserted.Load() }, time.Minute, 20*time.Millisecond, "every event processed")
	close(stop)
	workers.Wait()
	var rows int64
	require.NoError(t, drv.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM ferry_inbox WHERE state = 'processed'`).Scan(&rows))
	require.Equal(t, inserted.Load(), rows)
	require.Zero(t, drv.Reruns(), "no deadlock or lock wait timeout in any transaction of the driver")
	require.Zero(t, drv.Duplicates(), "no duplicate key met")
}

// TestCompletionRefusesATransactionInnoDBEnded: a handler that swallowed
// the error of a statement after which InnoDB rolled its transaction back
// (here: a ROLLBACK of its own) runs on outside any transaction; its
// event is not marked processed by a statement that would commit on its
// own.
func TestCompletionRefusesATransactionInnoDBEnded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv := newDriver(t, nil)
	ev := ferrydrivertest.Event("t", "k", "one")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{ev}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	err = drv.RunInTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `ROLLBACK`); err != nil {
			return err
		}
		return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: ev.ID, Claim: rows[0].Claim})
	})
	require.ErrorContains(t, err, "rolled back before the event was marked processed")
	st, err := drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: "g", EventIDs: []uuid.UUID{ev.ID}})
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessing, st[ev.ID].State)
}

// TestDeadReasonsKeepLongReasonsApart: DEAD events grouped by their last
// error, each group with its count and newest IDs; two errors that share
// their first 2,000 bytes stay two groups (MySQL compares only a prefix
// of a BLOB when it groups by it), and bytes that are not UTF-8 come back
// as they were.
func TestDeadReasonsKeepLongReasonsApart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv := newDriver(t, nil)
	prefix := strings.Repeat("x", 2000)
	reasons := []string{prefix + "-one", prefix + "-two", prefix + "-two", "\xff\x00 not text"}
	var evs []*ferryevent.Event
	for i := range reasons {
		evs = append(evs, ferrydrivertest.Event("t", "k"+strconv.Itoa(i), strconv.Itoa(i)))
	}
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: evs})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 10, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, rows, len(reasons))
	for _, r := range rows {
		i, _ := strconv.Atoi(string(r.Event.Payload))
		require.NoError(t, drv.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: "g", EventID: r.Event.ID, Claim: r.Claim, Error: reasons[i], Dead: true}))
	}
	got, err := drv.InboxDeadReasons(ctx, &ferrydriver.ReasonsParams{Group: "g", IDs: 5})
	require.NoError(t, err)
	require.Equal(t, 4, got.Scanned)
	require.Len(t, got.Groups, 3)
	require.Equal(t, prefix+"-two", got.Groups[0].Reason, "the most rows first")
	require.Equal(t, 2, got.Groups[0].Count)
	require.ElementsMatch(t, []uuid.UUID{evs[1].ID, evs[2].ID}, got.Groups[0].EventIDs)
	byReason := map[string]int{}
	for _, g := range got.Groups {
		byReason[g.Reason] = g.Count
	}
	require.Equal(t, map[string]int{prefix + "-one": 1, prefix + "-two": 2, "\xff\x00 not text": 1}, byReason)
	hist, err := drv.InboxAttempts(ctx, &ferrydriver.InboxAttemptsParams{Group: "g", EventID: evs[3].ID})
	require.NoError(t, err)
	require.Len(t, hist, 1)
	require.Equal(t, "\uFFFD\x00 not text", hist[0].Error, "the history's JSON keeps what is valid UTF-8")
}

// TestInboxMigrationReverts: migration 2 (and those after it) reverts (its tables go, the
// outbox's stay) and applies again.
func TestInboxMigrationReverts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newDriver(t, nil)
	tables := func() []string {
		rows, err := drv.DB().QueryContext(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'ferry\_%' ORDER BY 1`)
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			out = append(out, n)
		}
		return out
	}
	all := tables()
	latest := len(ferrymysql.Migrations())
	res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true, Steps: latest - 1})
	require.NoError(t, err)
	require.Equal(t, 1, res.Current)
	require.NotContains(t, tables(), "ferry_inbox")
	require.Contains(t, tables(), "ferry_outbox")
	res, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	require.Equal(t, latest, res.Current)
	require.Equal(t, all, tables())
	_, err = drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{ferrydrivertest.Event("t", "k", "x")}})
	require.NoError(t, err)
}

// TestUpgradeRunsRowsClaimedUnderTheOldSchema: a database of release 0.1
// whose consumer stopped with a row claimed (stored PROCESSING then;
// claims live on the key's row since migration 004) runs the row again
// after the upgrade, its counted attempt kept, and the key's later row
// after it.
func TestUpgradeRunsRowsClaimedUnderTheOldSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newDriver(t, nil)
	_, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true})
	require.NoError(t, err)
	a, b := ferrydrivertest.Event("t", "k", "a"), ferrydrivertest.Event("t", "k", "b")
	// Written as 0.1 wrote them: a's claim live for an hour, the key
	// waiting for its expiry.
	later := time.Now().Add(time.Hour).UnixMicro()
	for _, ev := range []*ferryevent.Event{a, b} {
		_, err := drv.DB().ExecContext(ctx, `INSERT INTO ferry_inbox (group_name, event_id, k, topic, type, payload, created_at, next_attempt_at, received_at)
			VALUES ('g', ?, 'k', 't', ?, ?, 0, 0, 0)`, ev.ID[:], ev.Type, ev.Payload)
		require.NoError(t, err)
	}
	_, err = drv.DB().ExecContext(ctx, `UPDATE ferry_inbox SET state = 'processing', attempts = 1, claimed_by = 'old', claim_token = ?,
		claim_expires_at = ? WHERE event_id = ?`, a.ID[:], later, a.ID[:])
	require.NoError(t, err)
	_, err = drv.DB().ExecContext(ctx, `INSERT INTO ferry_inbox_keys (group_name, k, runnable_at) VALUES ('g', 'k', ?)`, later)
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)

	ferrydrivertest.RunsClaimedRowsAgain(ctx, t, drv, "g", a, b)
}

// TestInboxSuiteOnTheApplicationsPool runs the inbox and transactor
// suites over a driver made with New on a pool of the application's that
// prepares its statements on the server (no interpolateParams, unlike the
// pools Open makes): every statement's parameters pass both ways.
func TestInboxSuiteOnTheApplicationsPool(t *testing.T) {
	t.Parallel()
	open := func(t *testing.T) *ferrymysql.Driver {
		dsn := mysqltest.Database(t)
		db, err := sql.Open("mysql", dsn)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		drv, err := ferrymysql.New(db, &ferrymysql.Config{DSN: dsn})
		require.NoError(t, err)
		t.Cleanup(func() { _ = drv.Close() })
		_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
		require.NoError(t, err)
		return drv
	}
	t.Run("Inbox", func(t *testing.T) {
		ferrydrivertest.ExerciseInbox(t, func(t *testing.T) ferrydrivertest.InboxDriver[*sql.Tx] { return open(t) })
	})
	t.Run("Transactor", func(t *testing.T) {
		ferrydrivertest.ExerciseTransactor(t, func(t *testing.T) ferrydrivertest.TransactorDriver[*sql.Tx] { return open(t) })
	})
}

// TestClaimsNeverWait: a claim skips a key whose row another transaction
// holds instead of waiting for it (InnoDB would wait 50 s, the claim's
// context allows 10), and runs it once released; it waits for no inbox
// row either, since it writes none.
func TestClaimsNeverWait(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv := newDriver(t, nil)
	a, b, c := ferrydrivertest.Event("t", "a", "a"), ferrydrivertest.Event("t", "b", "b"), ferrydrivertest.Event("t", "c", "c")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{a, b, c}})
	require.NoError(t, err)
	other, err := drv.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = other.Rollback() }()
	var one int
	require.NoError(t, other.QueryRowContext(ctx, `SELECT 1 FROM ferry_inbox_keys WHERE group_name = 'g' AND k = 'a' FOR UPDATE`).Scan(&one))
	require.NoError(t, other.QueryRowContext(ctx, `SELECT 1 FROM ferry_inbox WHERE group_name = 'g' AND event_id = ? FOR UPDATE`, b.ID[:]).Scan(&one))
	claim := func() []string {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		rows, err := drv.ClaimInbox(cctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 10, TTL: time.Minute})
		require.NoError(t, err, "a claim does not wait for locks")
		var got []string
		for _, r := range rows {
			got = append(got, string(r.Event.Payload))
		}
		return got
	}
	// A claim writes keys only: a row another transaction holds (a
	// retraction's, a stale attempt's finish, which both lock the key
	// next and find the claim) does not stop it.
	require.ElementsMatch(t, []string{"b", "c"}, claim(), "the held key is skipped")
	require.NoError(t, other.Rollback())
	var got []string
	require.Eventually(t, func() bool { got = append(got, claim()...); return len(got) == 1 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{"a"}, got)
}
