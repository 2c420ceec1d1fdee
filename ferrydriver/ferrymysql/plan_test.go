package ferrymysql_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// explain returns the server's plan of q as text rows (EXPLAIN).
func explain(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, q string, args ...any) []string {
	t.Helper()
	rows, err := drv.DB().QueryContext(ctx, "EXPLAIN "+q, args...)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		line := ""
		for i, c := range cols {
			v := vals[i]
			if b, ok := v.([]byte); ok {
				v = string(b)
			}
			line += fmt.Sprintf("%s=%v ", c, v)
		}
		out = append(out, line)
	}
	require.NoError(t, rows.Err())
	return out
}

// rowsRead runs q on one connection and returns how many index and table
// rows the server read for it (the session's Handler_read_* counters).
func rowsRead(ctx context.Context, t *testing.T, drv *ferrymysql.Driver, q string, args ...any) (int64, int) {
	t.Helper()
	conn, err := drv.DB().Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	reads := func() int64 {
		rows, err := conn.QueryContext(ctx, `SHOW SESSION STATUS LIKE 'Handler_read%'`)
		require.NoError(t, err)
		defer rows.Close()
		var n int64
		for rows.Next() {
			var name string
			var v int64
			require.NoError(t, rows.Scan(&name, &v))
			n += v
		}
		require.NoError(t, rows.Err())
		return n
	}
	before := reads()
	rows, err := conn.QueryContext(ctx, q, args...)
	require.NoError(t, err)
	got := 0
	for rows.Next() {
		got++
	}
	require.NoError(t, rows.Err())
	rows.Close()
	return reads() - before, got
}

// TestInboxListsReadTheirPageOnly: over a group of 8,000 rows in four
// states (200 keys), a page of each state, of a key's rows, after a
// cursor, the capped counts, a claim's reading of heads and the groups
// read about what they return, not the group's rows (the server's own
// count of rows read, Handler_read_*); each plan names its index.
func TestInboxListsReadTheirPageOnly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	var evs []*ferryevent.Event
	for i := range 8000 {
		evs = append(evs, ferrydrivertest.Event("t", "k"+strconv.Itoa(i%200), strconv.Itoa(i)))
	}
	for i := 0; i < len(evs); i += 1000 {
		_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: evs[i : i+1000]})
		require.NoError(t, err)
	}
	// A quarter each of processed, dead, failed and pending, as if run.
	_, err := drv.DB().ExecContext(ctx, `UPDATE ferry_inbox SET state = ELT(1 + pos % 4, 'processed', 'dead', 'failed', 'pending'),
       finished_at = IF(pos % 4 < 2, received_at + pos, NULL)`)
	require.NoError(t, err)
	_, err = drv.DB().ExecContext(ctx, `ANALYZE TABLE ferry_inbox, ferry_inbox_keys`)
	require.NoError(t, err)
	keyWith := func(states string) string {
		var k string
		require.NoError(t, drv.DB().QueryRowContext(ctx, `SELECT k FROM ferry_inbox WHERE state IN (`+states+`) GROUP BY k HAVING COUNT(*) >= 5 ORDER BY k LIMIT 1`).Scan(&k))
		return k
	}
	pendingKey, blockedKey := keyWith(`'pending'`), keyWith(`'failed', 'dead'`)
	dead, err := drv.ListInbox(ctx, &ferrydriver.ListInboxParams{Group: "g", Limit: 20})
	require.NoError(t, err)
	require.Len(t, dead, 20)
	const page = 20
	for _, c := range []struct {
		p     *ferrydriver.ListInboxParams
		index string
		want  int
	}{
		{&ferrydriver.ListInboxParams{Group: "g", States: []ferrydriver.InboxState{ferrydriver.InboxProcessed}, Limit: page}, "ferry_inbox_pages_idx", page},
		{&ferrydriver.ListInboxParams{Group: "g", States: []ferrydriver.InboxState{ferrydriver.InboxPending}, Limit: page}, "ferry_inbox_pages_idx", page},
		{&ferrydriver.ListInboxParams{Group: "g", States: []ferrydriver.InboxState{ferrydriver.InboxFailed}, Limit: page}, "ferry_inbox_pages_idx", page},
		{&ferrydriver.ListInboxParams{Group: "g", Limit: page, After: driverkit.InboxCursorOf(dead[len(dead)-1])}, "ferry_inbox_pages_idx", page},
		{&ferrydriver.ListInboxParams{Group: "g", States: []ferrydriver.InboxState{ferrydriver.InboxDead, ferrydriver.InboxProcessed}, Limit: page}, "ferry_inbox_pages_idx", page},
		{&ferrydriver.ListInboxParams{Group: "g", States: []ferrydriver.InboxState{ferrydriver.InboxPending}, Key: pendingKey, Limit: 5}, "ferry_inbox_key_pages_idx", 5},
		{&ferrydriver.ListInboxParams{Group: "g", States: []ferrydriver.InboxState{ferrydriver.InboxProcessing, ferrydriver.InboxFailed, ferrydriver.InboxDead}, Key: blockedKey, Limit: 5}, "ferry_inbox_key_pages_idx", 5},
		// An event's timeline: its row, whatever its state.
		{&ferrydriver.ListInboxParams{Group: "g", States: ferrydriver.InboxStates, EventIDs: []uuid.UUID{evs[4321].ID}, Limit: 1}, "ferry_inbox_event_idx", 1},
	} {
		q, args, err := ferrymysql.ListInboxQuery(c.p)
		require.NoError(t, err)
		plan := explain(ctx, t, drv, q, args...)
		for _, line := range plan {
			if strings.Contains(line, "table=ferry_inbox ") {
				require.Contains(t, line, "key="+c.index+" ", "list %v key %q: %v", c.p.States, c.p.Key, plan)
				require.NotContains(t, line, "filesort", "list %v key %q: the index gives the order: %v", c.p.States, c.p.Key, plan)
			}
		}
		read, got := rowsRead(ctx, t, drv, q, args...)
		require.Equal(t, c.want, got)
		// A page of each state, and, for several, the union's temporary
		// table written and read back: about the page, whatever the group
		// holds (a quarter of it is 2,000 rows of a state).
		bound := int64(c.want + 2)
		if slices.ContainsFunc(c.p.States, func(s ferrydriver.InboxState) bool {
			return s == ferrydriver.InboxPending || s == ferrydriver.InboxFailed
		}) {
			// A PENDING or FAILED row inside its key's claim reads as
			// PROCESSING: each such row read looks its key up (two reads
			// of the keys' primary key: the entry, and the next).
			bound = 3*int64(c.want) + 2
		}
		if len(c.p.States) > 1 {
			bound = 3 * int64(len(c.p.States)) * bound
		}
		require.LessOrEqual(t, read, bound, "list %v key %q read %d rows for a page of %d", c.p.States, c.p.Key, read, got)
	}
	q, args := ferrymysql.InboxCountsQuery("g")
	read, _ := rowsRead(ctx, t, drv, q, args...)
	// Each unfinished state's entries (2,000 each here, under the cap),
	// counted from the index and the derived table: none of the processed.
	require.LessOrEqual(t, read, int64(2*6000+100), "counts read the unfinished states only, each up to the cap (%d)", read)
	q, args = ferrymysql.ClaimHeadsQuery("g", []string{"k1", "k2", "k3"})
	read, got := rowsRead(ctx, t, drv, q, args...)
	require.Equal(t, 3, got)
	require.Less(t, read, int64(60), "a claim reads a few entries per key (%d)", read)
	read, _ = rowsRead(ctx, t, drv, ferrymysql.InboxGroupsQuery, 1000)
	require.Less(t, read, int64(20), "groups: one dive per group (%d)", read)
	for _, c := range []struct {
		q, index string
		args     []any
	}{
		{ferrymysql.DeleteProcessedQuery, "ferry_inbox_pages_idx", []any{"g", 1, 100}},
		{ferrymysql.ForgetKeysQuery, "ferry_inbox_keys_runnable_idx", []any{"g", 100}},
	} {
		q, index := c.q, c.index
		plan := explain(ctx, t, drv, q, c.args...)
		require.Len(t, plan, 1)
		require.Contains(t, plan[0], "key="+index+" ", "retention walks an index: %v", plan)
	}
}

// TestClaimReadsHeadsFromTheirIndex: a claim finds each key's oldest row
// of a state at the start of its range of ferry_inbox_head_idx, even on a
// table whose statistics predate its rows (a consumer's first claims after
// a backlog arrives), where the optimizer would otherwise walk the primary
// key in pos order for ORDER BY pos LIMIT 1: through every row, for a state
// the key has none of.
func TestClaimReadsHeadsFromTheirIndex(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newDriver(t, nil)
	var evs []*ferryevent.Event
	for i := range 3000 {
		evs = append(evs, ferrydrivertest.Event("t", "k"+strconv.Itoa(i%500), strconv.Itoa(i)))
	}
	for i := 0; i < len(evs); i += 1000 {
		_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: evs[i : i+1000]})
		require.NoError(t, err)
	}
	q, args := ferrymysql.ClaimHeadsQuery("g", []string{"k1", "k2", "k3", "k4"})
	read, got := rowsRead(ctx, t, drv, q, args...)
	require.Equal(t, 4, got)
	require.Less(t, read, int64(80), "a claim reads a few entries per key, not the table (%d)", read)

	// The runs after those heads: each key's next rows, a range each.
	var heads []int64
	for _, k := range []string{"k1", "k2", "k3", "k4"} {
		var pos int64
		require.NoError(t, drv.DB().QueryRowContext(ctx, `SELECT MIN(pos) FROM ferry_inbox WHERE group_name = 'g' AND k = ?`, k).Scan(&pos))
		heads = append(heads, pos)
	}
	q, args = ferrymysql.ClaimRunsQuery("g", []string{"k1", "k2", "k3", "k4"}, heads, 31)
	read, got = rowsRead(ctx, t, drv, q, args...)
	require.Equal(t, 4*5, got, "each key's five rows after its head")
	require.Less(t, read, int64(60), "runs read their keys' rows, not the table (%d)", read)
}
