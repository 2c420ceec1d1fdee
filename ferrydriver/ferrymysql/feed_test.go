package ferrymysql_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferryevent"
)

// appendIn appends events in tx and returns them.
func appendIn(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, tx *sql.Tx, evs ...*ferryevent.Event) []*ferryevent.Event {
	t.Helper()
	require.NoError(t, drv.AppendTx(ctx, tx, evs))
	return evs
}

func run(ctx context.Context, t *testing.T, q interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		_, err := q.ExecContext(ctx, s)
		require.NoError(t, err, s)
	}
}

// TestFeedRollbacksWrittenToTheBinlog: what MariaDB writes to the binlog
// of a transaction that is not all committed. A transaction that changed
// a table that cannot roll back (MyISAM, a temporary table) keeps its
// rolled-back rows there, between a SAVEPOINT and a ROLLBACK TO it, or in
// a group that ends with ROLLBACK. The feed delivers exactly what
// committed, each key in order with gapless sequences, to a reader that
// stops after any event (inside a savepoint among them) and resumes.
func TestFeedRollbacksWrittenToTheBinlog(t *testing.T) {
	t.Parallel()
	ev := func(key, tag string) *ferryevent.Event { return ferrydrivertest.Event("t", key, tag) }
	for _, tc := range []struct {
		name string
		// run writes in tx (and db) and returns what it committed.
		run func(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, tx *sql.Tx) (committed []*ferryevent.Event, commit bool)
	}{
		{"a MyISAM write after a savepoint", func(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, tx *sql.Tx) ([]*ferryevent.Event, bool) {
			want := appendIn(ctx, t, drv, tx, ev("k", "1"), ev("j", "1"))
			run(ctx, t, tx, "SAVEPOINT g")
			appendIn(ctx, t, drv, tx, ev("k", "undone"), ev("j", "undone"))
			run(ctx, t, tx, "INSERT INTO test_myisam (v) VALUES (1)", "ROLLBACK TO SAVEPOINT g")
			return append(want, appendIn(ctx, t, drv, tx, ev("k", "2"), ev("j", "2"))...), true
		}},
		{"a temporary table, nested and renamed savepoints", func(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, tx *sql.Tx) ([]*ferryevent.Event, bool) {
			run(ctx, t, tx, "CREATE TEMPORARY TABLE test_tmp (v INT) ENGINE=InnoDB")
			want := appendIn(ctx, t, drv, tx, ev("k", "1"))
			run(ctx, t, tx, "SAVEPOINT a")
			appendIn(ctx, t, drv, tx, ev("k", "undone a"))
			run(ctx, t, tx, "SAVEPOINT b", "INSERT INTO test_tmp VALUES (1)")
			appendIn(ctx, t, drv, tx, ev("k", "undone b"))
			run(ctx, t, tx, "ROLLBACK TO SAVEPOINT a")
			want = append(want, appendIn(ctx, t, drv, tx, ev("k", "2"))...)
			run(ctx, t, tx, "SAVEPOINT A") // replaces a (names are not case-sensitive)
			appendIn(ctx, t, drv, tx, ev("k", "undone A"))
			run(ctx, t, tx, "ROLLBACK TO SAVEPOINT a")
			return append(want, appendIn(ctx, t, drv, tx, ev("k", "3"))...), true
		}},
		{"a savepoint taken before the first write", func(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, tx *sql.Tx) ([]*ferryevent.Event, bool) {
			run(ctx, t, tx, "SAVEPOINT first")
			appendIn(ctx, t, drv, tx, ev("k", "undone"))
			run(ctx, t, tx, "INSERT INTO test_myisam (v) VALUES (1)", "ROLLBACK TO SAVEPOINT first")
			return appendIn(ctx, t, drv, tx, ev("k", "1")), true
		}},
		{"a rolled-back transaction with a temporary table", func(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, tx *sql.Tx) ([]*ferryevent.Event, bool) {
			run(ctx, t, tx, "CREATE TEMPORARY TABLE test_tmp (v INT) ENGINE=MyISAM", "INSERT INTO test_tmp VALUES (1)")
			appendIn(ctx, t, drv, tx, ev("k", "undone 1"), ev("j", "undone 1"))
			return nil, false
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			drv := newDriver(t, nil)
			run(ctx, t, drv.DB(), "CREATE TABLE test_myisam (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=MyISAM")
			before := emitN(ctx, t, drv, 4, 2, "before-")
			tx, err := drv.DB().BeginTx(ctx, nil)
			require.NoError(t, err)
			want, commit := tc.run(ctx, t, drv, tx)
			if commit {
				require.NoError(t, tx.Commit())
			} else {
				require.NoError(t, tx.Rollback())
			}
			after := emitN(ctx, t, drv, 4, 2, "after-")
			// An event of the same keys after the rollback: its sequence
			// follows the committed ones.
			ferrydrivertest.RequireEveryStop(ctx, t, drv, append(append(before, want...), after...))
		})
	}
}

// TestFeedHoldsALargeTransactionOnce: a transaction with more rows than a
// feed holds in memory is read to its end, then again from its start:
// delivered exactly, rolled-back savepoints left out, from any stop.
func TestFeedHoldsALargeTransactionOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	drv.SetFeedLimits(4, 100_000, time.Second)
	run(ctx, t, drv.DB(), "CREATE TABLE test_myisam (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=MyISAM")
	tx, err := drv.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	var want []*ferryevent.Event
	for i := range 6 {
		want = append(want, appendIn(ctx, t, drv, tx, ferrydrivertest.Event("t", "k"+strconv.Itoa(i%2), strconv.Itoa(i)))...)
	}
	run(ctx, t, tx, "SAVEPOINT g")
	for i := range 5 {
		appendIn(ctx, t, drv, tx, ferrydrivertest.Event("t", "k"+strconv.Itoa(i%2), "undone"))
	}
	run(ctx, t, tx, "INSERT INTO test_myisam (v) VALUES (1)", "ROLLBACK TO SAVEPOINT g")
	for i := 6; i < 9; i++ {
		want = append(want, appendIn(ctx, t, drv, tx, ferrydrivertest.Event("t", "k"+strconv.Itoa(i%2), strconv.Itoa(i)))...)
	}
	require.NoError(t, tx.Commit())
	ferrydrivertest.RequireEveryStop(ctx, t, drv, want)
	require.Positive(t, drv.Rereads(), "the transaction was read twice")
}

// xaTx runs XA statements on a connection of its own, writing outbox rows
// as an application outside Go's database/sql transactions would.
type xaTx struct {
	t    *testing.T
	conn *sql.Conn
	xid  string
	seq  map[string]int64
}

func startXA(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, xid string, seq map[string]int64) *xaTx {
	conn := freshConn(ctx, t, drv.DB())
	// A prepared XA transaction outlives its connection, and the
	// server's: one a failed run left behind holds its rows' locks.
	t.Cleanup(func() {
		_, _ = conn.ExecContext(context.Background(), "XA END '"+xid+"'")
		_, _ = conn.ExecContext(context.Background(), "XA ROLLBACK '"+xid+"'")
	})
	run(ctx, t, conn, "XA START '"+xid+"'")
	return &xaTx{t: t, conn: conn, xid: xid, seq: seq}
}

// freshConn is a connection of db's for statements of a session (a pooled
// connection the server closed fails its first statement, and a sql.Conn
// cannot move to another).
func freshConn(ctx context.Context, t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	for attempt := 0; ; attempt++ {
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		if err = conn.PingContext(ctx); err == nil {
			t.Cleanup(func() { _ = conn.Close() })
			return conn
		}
		_ = conn.Close()
		require.Less(t, attempt, 3, "a connection that answers: %v", err)
	}
}

// append writes an outbox row for each event (partition 0 of 1), with the
// key's next sequence number.
func (x *xaTx) append(ctx context.Context, evs ...*ferryevent.Event) []*ferryevent.Event {
	for _, ev := range evs {
		x.seq[ev.Key]++
		ev.Seq = x.seq[ev.Key]
		_, err := x.conn.ExecContext(ctx, `INSERT INTO ferry_outbox (p, event_id, topic, k, seq, type, source, content_type, headers, payload, created_at, appended_at)
VALUES (0, ?, ?, ?, ?, ?, '', '', NULL, ?, ?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))`,
			ev.ID[:], ev.Topic, ev.Key, ev.Seq, ev.Type, ev.Payload, ev.CreatedAt.UnixMicro())
		require.NoError(x.t, err)
	}
	return evs
}

func (x *xaTx) prepare(ctx context.Context) {
	run(ctx, x.t, x.conn, "XA END '"+x.xid+"'", "XA PREPARE '"+x.xid+"'")
}

// TestFeedXATransactions: an XA transaction is written to the binlog at its
// PREPARE and committed later. Its events are delivered at its XA COMMIT
// and never before (a reader sees the events committed after its PREPARE
// first), also by a relay started between the two; an XA transaction
// rolled back after its PREPARE delivers nothing; a one-phase commit is a
// transaction like any other.
func TestFeedXATransactions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	n, err := drv.StoredPartitions(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	ev := func(key, tag string) *ferryevent.Event { return ferrydrivertest.Event("t", key, tag) }
	seq := map[string]int64{}

	committed := startXA(ctx, t, drv, "ferry-xa-1", seq)
	prepared := committed.append(ctx, ev("xa", "1"), ev("xa", "2"), ev("xb", "1"))
	committed.prepare(ctx)
	undone := startXA(ctx, t, drv, "ferry-xa-2", map[string]int64{})
	undone.append(ctx, ev("xc", "undone"))
	run(ctx, t, undone.conn, "SAVEPOINT s") // also written in a PREPARE group
	undone.append(ctx, ev("xc", "undone too"))
	undone.prepare(ctx)
	between := emitN(ctx, t, drv, 6, 2, "between-")

	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	requireKeyOrder(t, between, r.ReadQuiet(ctx))
	var c struct {
		XA []struct{ XID string } `json:"xa"`
	}
	require.NoError(t, json.Unmarshal(r.Last, &c))
	require.Len(t, c.XA, 2, "the cursor holds both prepared transactions: %s", r.Last)
	require.NoError(t, r.Feed.Close())

	// A relay started while they are prepared delivers at their outcome.
	run(ctx, t, committed.conn, "XA COMMIT 'ferry-xa-1'")
	run(ctx, t, undone.conn, "XA ROLLBACK 'ferry-xa-2'")
	onePhase := startXA(ctx, t, drv, "ferry-xa-3", seq)
	last := onePhase.append(ctx, ev("xa", "3"))
	run(ctx, t, onePhase.conn, "XA END 'ferry-xa-3'", "XA COMMIT 'ferry-xa-3' ONE PHASE")
	after := emitN(ctx, t, drv, 4, 2, "after-")
	resumed := ferrydrivertest.OpenReader(ctx, t, drv, r.Last)
	requireKeyOrder(t, append(append(prepared, last...), after...), resumed.ReadQuiet(ctx))
	require.NotContains(t, string(resumed.Last), `"xa"`, "no transaction is held after its outcome")

	ferrydrivertest.RequireEveryStop(ctx, t, drv, append(append(append(between, prepared...), last...), after...))
}

// TestFeedWaitsForVisibility: MariaDB writes a transaction to the binlog
// before InnoDB makes it visible. A batch is returned only once every
// event in it can be read by another connection: 20,000 events from
// concurrent producers, each batch checked the moment it is returned.
func TestFeedWaitsForVisibility(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	const producers, each = 8, 2500
	other := drv.DB() // a read of its own, on another connection than the feed's
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := 0; i < each; {
				n := min(1+i%2, each-i)
				var evs []*ferryevent.Event
				for j := range n {
					evs = append(evs, ferrydrivertest.Event("t", "p"+strconv.Itoa(p)+"-"+strconv.Itoa((i+j)%7), strconv.Itoa(i+j)))
				}
				if err := drv.Append(ctx, evs); err != nil {
					t.Error(err)
					return
				}
				i += n
			}
		})
	}
	got, missing := 0, 0
	seen := map[string]string{}
	for got < producers*each && ctx.Err() == nil {
		b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 500, Wait: 100 * time.Millisecond})
		require.NoError(t, err)
		if len(b.Events) == 0 {
			continue
		}
		var cond []string
		var args []any
		for _, e := range b.Events {
			if prev, dup := seen[e.ID.String()]; dup {
				t.Errorf("event %s (key %s, seq %d) delivered twice: %s and in the batch ending at %s", e.ID, e.Key, e.Seq, prev, b.Cursor)
			}
			seen[e.ID.String()] = string(b.Cursor)
			cond = append(cond, "(k = ? AND seq = ?)")
			args = append(args, e.Key, e.Seq)
		}
		var visible int
		require.NoError(t, other.QueryRowContext(ctx, `SELECT COUNT(*) FROM ferry_outbox WHERE p = 0 AND (`+strings.Join(cond, " OR ")+`)`, args...).Scan(&visible))
		missing += len(b.Events) - visible
		got += len(b.Events)
	}
	wg.Wait()
	require.Equal(t, producers*each, got)
	require.Zero(t, missing, "events returned before another connection could read them")
}

// binlogPos is a cursor's binlog position.
func binlogPos(t *testing.T, cur []byte) (string, uint32) {
	var c struct {
		File string
		Pos  uint32
	}
	require.NoError(t, json.Unmarshal(cur, &c))
	return c.File, c.Pos
}

// TestFeedReadIsBounded: a feed far behind, catching up through other
// tables' transactions, returns after a bounded number of binlog events
// with its cursor moved (so a relay saves its progress as it goes),
// instead of reading to the binlog's end in one Read.
func TestFeedReadIsBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	drv.SetFeedLimits(10_000, 50, time.Second)
	for range 100 {
		run(ctx, t, drv.DB(), "INSERT INTO test_writes (v) VALUES (1)")
	}
	end, err := mysqlEnd(ctx, drv.DB())
	require.NoError(t, err)
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 0})
	require.NoError(t, err)
	require.Empty(t, b.Events)
	file, pos := binlogPos(t, b.Cursor)
	start, startPos := binlogPos(t, mustStart(ctx, t, drv))
	require.True(t, file > start || (file == start && pos > startPos), "the cursor moved: %s", b.Cursor)
	require.True(t, file < end.file || (file == end.file && pos < end.pos), "the read stopped before the binlog's end (%s:%d): %s", end.file, end.pos, b.Cursor)
	r.Last = b.Cursor
	want := emitN(ctx, t, drv, 5, 2, "x")
	requireKeyOrder(t, want, r.ReadN(ctx, 5))
}

type binlogEnd struct {
	file string
	pos  uint32
}

func mysqlEnd(ctx context.Context, db *sql.DB) (binlogEnd, error) {
	var e binlogEnd
	rows, err := db.QueryContext(ctx, `SHOW MASTER STATUS`)
	if err != nil {
		return e, err
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	if !rows.Next() {
		return e, rows.Err()
	}
	dest := []any{&e.file, &e.pos}
	for range len(cols) - 2 {
		dest = append(dest, new(sql.RawBytes))
	}
	return e, rows.Scan(dest...)
}

// mustStart is the cursor a feed with no checkpoint starts from.
func mustStart(ctx context.Context, t *testing.T, drv *ferrymysql.Driver) []byte {
	var file string
	var pos uint32
	require.NoError(t, drv.DB().QueryRowContext(ctx, `SELECT binlog_file, binlog_pos FROM ferry_settings WHERE id = 1`).Scan(&file, &pos))
	b, err := json.Marshal(map[string]any{"file": file, "pos": pos})
	require.NoError(t, err)
	return b
}

// TestFeedRefusesADivergedServer: a server whose binlog lacks the GTID
// position the checkpoint names (it never applied what the feed already
// delivered: a failover to a replica that was behind) is an error that
// says what to do, not a silent rescan of the outbox.
func TestFeedRefusesADivergedServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	evs := emitN(ctx, t, drv, 3, 1, "x")
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	requireKeyOrder(t, evs, r.ReadN(ctx, 3))
	var c map[string]any
	require.NoError(t, json.Unmarshal(r.Last, &c))
	gtid, _ := c["gtid"].(string)
	require.NotEmpty(t, gtid, "the cursor has a GTID position: %s", r.Last)
	parts := strings.Split(gtid, "-")
	seq, err := strconv.ParseUint(parts[len(parts)-1], 10, 64)
	require.NoError(t, err)
	parts[len(parts)-1] = strconv.FormatUint(seq+1_000_000_000, 10)
	c["gtid"] = strings.Join(parts, "-")
	ahead, err := json.Marshal(c)
	require.NoError(t, err)

	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "test/0", Cursor: ahead})
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.Error(t, err, "a position the server never had is refused")
	require.ErrorContains(t, err, "does not have the checkpoint's GTID position "+c["gtid"].(string))
	require.ErrorContains(t, err, "UPDATE ferry_checkpoints SET pos = ")
	t.Log(err)
}

// TestFeedReadsAStatementWrittenOutbox: a session that writes the binlog
// as statements (binlog_format = STATEMENT) leaves no rows of its outbox
// writes there; the feed finds its events by a scan of the outbox instead
// of losing them.
func TestFeedReadsAStatementWrittenOutbox(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	before := emitN(ctx, t, drv, 4, 2, "before-")
	conn := freshConn(ctx, t, drv.DB())
	run(ctx, t, conn, "SET SESSION binlog_format = 'STATEMENT'")
	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	statement := appendIn(ctx, t, drv, tx, ferrydrivertest.Event("t", "k0", "statement"), ferrydrivertest.Event("t", "s", "statement"))
	require.NoError(t, tx.Commit())
	run(ctx, t, conn, "SET SESSION binlog_format = 'ROW'")
	after := emitN(ctx, t, drv, 4, 2, "after-")
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	requireKeyOrder(t, append(append(before, statement...), after...), r.ReadQuiet(ctx))
	later := emitN(ctx, t, drv, 3, 2, "later-")
	requireKeyOrder(t, later, r.ReadN(ctx, 3))
}

// TestFeedDecodesOnlyTheOutbox: the feed's binlog reader decodes the rows
// of ferry_outbox's inserts only; the server's other tables (here a wide
// one) arrive undecoded.
func TestFeedDecodesOnlyTheOutbox(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	run(ctx, t, drv.DB(), "CREATE TABLE test_wide (id INT AUTO_INCREMENT PRIMARY KEY, body LONGBLOB) ENGINE=InnoDB")
	for range 20 {
		run(ctx, t, drv.DB(), "INSERT INTO test_wide (body) VALUES (REPEAT('x', 100000))")
	}
	evs := emitN(ctx, t, drv, 5, 2, "x")
	run(ctx, t, drv.DB(), "UPDATE test_wide SET body = 'y'", "DELETE FROM test_wide")
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	requireKeyOrder(t, evs, r.ReadQuiet(ctx))
	require.Zero(t, ferrymysql.ForeignRows(r.Feed), "other tables' rows were decoded")
}
