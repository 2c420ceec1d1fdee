package ferrymysql_test

import (
	"context"
	"database/sql"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryshared/testenv"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
	"github.com/ferry-dev/ferry/ferryevent"
)

// emitN appends n events of keys k0..k(keys-1), one transaction each
// batch of 10, and returns them in emit order.
func emitN(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, n, keys int, tag string) []*ferryevent.Event {
	t.Helper()
	var all []*ferryevent.Event
	for i := 0; i < n; i += 10 {
		var batch []*ferryevent.Event
		for j := i; j < min(i+10, n); j++ {
			batch = append(batch, ferrydrivertest.Event("t", "k"+strconv.Itoa(j%keys), tag+strconv.Itoa(j)))
		}
		require.NoError(t, drv.Append(ctx, batch))
		all = append(all, batch...)
	}
	return all
}

// requireKeyOrder checks got holds want's events, once each, every key's
// in want's order.
func requireKeyOrder(t *testing.T, want, got []*ferryevent.Event) {
	t.Helper()
	pos := map[string]int{}
	for i, e := range got {
		_, dup := pos[e.ID.String()]
		require.False(t, dup, "event %s delivered twice", e.ID)
		pos[e.ID.String()] = i
	}
	require.Len(t, got, len(want))
	last := map[string]int{}
	for _, e := range want {
		p, ok := pos[e.ID.String()]
		require.True(t, ok, "event %s (key %s) was not delivered", e.ID, e.Key)
		if lp, ok := last[e.Key]; ok {
			require.Greater(t, p, lp, "key %s out of order", e.Key)
		}
		last[e.Key] = p
	}
}

// TestBinlogPurgedRecovers: a feed whose saved position was purged from
// the binlog scans the outbox from its last acknowledged event (minus the
// recovery margin) and follows the binlog after: every event committed
// after the checkpoint arrives, each key in order. It purges the shared
// server's binlogs, so it runs alone (not in parallel).
func TestBinlogPurgedRecovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	drv := newDriver(t, &ferrymysql.Config{RecoveryMargin: 50 * time.Millisecond})
	before := emitN(ctx, t, drv, 30, 4, "before-")
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	requireKeyOrder(t, before, r.ReadN(ctx, 30))
	checkpoint := r.Last
	require.NoError(t, r.Feed.Close())

	// While no relay reads: more events, then the binlog that holds them
	// is purged.
	time.Sleep(100 * time.Millisecond) // past the recovery margin: the scan must not reach back to "before"
	after := emitN(ctx, t, drv, 200, 7, "after-")
	purgeBinlogs(ctx, t)

	// From the purged position: a scan, then the binlog; events emitted
	// during the recovery arrive too.
	rec := ferrydrivertest.OpenReader(ctx, t, drv, checkpoint)
	first, err := rec.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 50, Wait: time.Second})
	require.NoError(t, err)
	require.Contains(t, string(first.Cursor), `"scan"`, "the feed scans the outbox")
	during := emitN(ctx, t, drv, 20, 7, "during-")
	// The scan starts at the last acknowledged event minus the margin: it
	// may deliver again the events acknowledged within the margin (their
	// consumers drop them by ID).
	again := map[string]bool{}
	for _, e := range before {
		again[e.ID.String()] = true
	}
	var got []*ferryevent.Event
	for _, e := range append(first.Events, rec.ReadN(ctx, 200+20-len(first.Events))...) {
		if !again[e.ID.String()] {
			got = append(got, e)
		}
	}
	if len(got) < 220 {
		got = append(got, rec.ReadN(ctx, 220-len(got))...)
	}
	requireKeyOrder(t, append(after, during...), got)
	require.Empty(t, rec.ReadQuiet(ctx), "nothing twice")
	require.NotContains(t, string(rec.Last), `"scan"`, "the feed follows the binlog again")
	later := emitN(ctx, t, drv, 10, 3, "later-")
	requireKeyOrder(t, later, rec.ReadN(ctx, 10))
}

// purgeBinlogs closes the server's binlog and purges every file before the
// new one. It purges the shared server's binlogs: its callers do not run
// in parallel.
func purgeBinlogs(ctx context.Context, t *testing.T) {
	admin := mysqltest.Admin(t)
	_, err := admin.ExecContext(ctx, `FLUSH BINARY LOGS`)
	require.NoError(t, err)
	var file string
	var pos uint64
	rows, err := admin.QueryContext(ctx, `SHOW MASTER STATUS`)
	require.NoError(t, err)
	cols, _ := rows.Columns()
	require.True(t, rows.Next())
	dest := []any{&file, &pos}
	for range len(cols) - 2 {
		dest = append(dest, new(sql.RawBytes))
	}
	require.NoError(t, rows.Scan(dest...))
	rows.Close()
	// The server keeps a file that a replication connection still reads:
	// the closed reader's goes a moment later.
	require.Eventually(t, func() bool {
		_, err := admin.ExecContext(ctx, `PURGE BINARY LOGS TO '`+file+`'`)
		require.NoError(t, err)
		var first string
		var size uint64
		require.NoError(t, admin.QueryRowContext(ctx, `SHOW BINARY LOGS`).Scan(&first, &size))
		return first == file
	}, 20*time.Second, 100*time.Millisecond, "the binlogs before %s are purged", file)
}

// TestBinlogPurgedRecoversALongTransaction: a producer transaction that
// stayed open longer than Config.RecoveryMargin, and whose commit was
// purged from the binlog before a relay read it, is delivered by the
// recovery scan: the scan starts before the oldest transaction that was
// open when the feed read its position (cursor.Open), not only the margin
// before the last event it delivered. Runs alone (it purges).
func TestBinlogPurgedRecoversALongTransaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	drv := newDriver(t, &ferrymysql.Config{RecoveryMargin: time.Millisecond})
	drv.SetFeedLimits(10_000, 100_000, 0) // the oldest open transaction read at every Read
	long, err := drv.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = long.Rollback() }()
	longEv := ferrydrivertest.Event("t", "long", "long")
	require.NoError(t, drv.AppendTx(ctx, long, []*ferryevent.Event{longEv}))
	time.Sleep(1100 * time.Millisecond) // the open transaction's start is read in whole seconds
	// One key a transaction: an append of several keys in one transaction
	// can wait for the open one's key row (ferry_keys is scanned whole
	// when it is small).
	var before []*ferryevent.Event
	for i := range 20 {
		ev := ferrydrivertest.Event("t", "k"+strconv.Itoa(i%4), "before-"+strconv.Itoa(i))
		require.NoError(t, drv.Append(ctx, []*ferryevent.Event{ev}))
		before = append(before, ev)
	}
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	requireKeyOrder(t, before, r.ReadN(ctx, 20))
	r.ReadQuiet(ctx)
	checkpoint := r.Last
	require.NoError(t, r.Feed.Close())

	// The long transaction commits while no relay reads, and the binlog
	// that holds its commit is purged.
	require.NoError(t, long.Commit())
	after := emitN(ctx, t, drv, 10, 3, "after-")
	purgeBinlogs(ctx, t)

	rec := ferrydrivertest.OpenReader(ctx, t, drv, checkpoint)
	var got []*ferryevent.Event
	for _, e := range rec.ReadQuiet(ctx) {
		if !slices.ContainsFunc(before, func(b *ferryevent.Event) bool { return b.ID == e.ID }) {
			got = append(got, e) // the scan may deliver again what came after the long transaction began
		}
	}
	requireKeyOrder(t, append([]*ferryevent.Event{longEv}, after...), got)
}

// TestFeedWithoutARecordedStartScans: a feed with no saved position whose
// database has no recorded binlog start (its migrations were applied by
// another tool) reads the outbox by a scan, then follows the binlog.
func TestFeedWithoutARecordedStartScans(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	_, err := drv.DB().ExecContext(ctx, `UPDATE ferry_settings SET binlog_file = NULL, binlog_pos = NULL`)
	require.NoError(t, err)
	before := emitN(ctx, t, drv, 95, 5, "x")
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 40, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Events, 40, "a scan reads a page at a time")
	require.Contains(t, string(b.Cursor), `"scan"`)
	got := append(b.Events, r.ReadN(ctx, 55)...)
	requireKeyOrder(t, before, got)
	more := emitN(ctx, t, drv, 10, 5, "y")
	requireKeyOrder(t, more, r.ReadN(ctx, 10))
	require.Empty(t, r.ReadQuiet(ctx))
}

// TestMisconfiguredServerIsRefused: a server whose binlog the feed cannot
// read (the shared MariaDB on 3306, FERRY_TEST_MYSQL_NOBINLOG_URL, writes
// none) is refused at OpenFeed with ferrydriver.ErrMisconfigured, naming
// the setting to change.
func TestMisconfiguredServerIsRefused(t *testing.T) {
	t.Parallel()
	url := "mysql://root@127.0.0.1:3306/"
	if u := os.Getenv("FERRY_TEST_MYSQL_NOBINLOG_URL"); u != "" {
		url = u
	}
	dsn, err := ferrymysql.DSNFromURL(url)
	require.NoError(t, err)
	admin, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	defer admin.Close()
	var logBin int
	if err := admin.QueryRow(`SELECT @@log_bin`).Scan(&logBin); err != nil {
		testenv.Unavailable(t, "MariaDB without a binlog", "FERRY_TEST_MYSQL_NOBINLOG_URL", err)
	}
	if logBin == 1 {
		t.Skipf("the server at %s writes a binlog: set FERRY_TEST_MYSQL_NOBINLOG_URL to one that does not", url)
	}
	name := "ferry_nobinlog_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	_, err = admin.Exec(`CREATE DATABASE ` + name)
	require.NoError(t, err)
	defer func() { _, _ = admin.Exec(`DROP DATABASE ` + name) }()
	drv, err := ferrymysql.Open(strings.Replace(dsn, ")/", ")/"+name, 1), nil)
	require.NoError(t, err)
	defer drv.Close()
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	_, err = drv.OpenFeed(context.Background(), &ferrydriver.OpenFeedParams{Feed: "x/0"})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured)
	require.Contains(t, err.Error(), "log_bin is off: start the server with log-bin")
	t.Log(err)
}
