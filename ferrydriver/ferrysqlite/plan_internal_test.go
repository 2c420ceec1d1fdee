package ferrysqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/stretchr/testify/require"
)

// TestDeadLetterPagesWalkTheListIndex: a page of dead letters, as the
// console and `ferry dlq list` ask for it, reads ferry_dead_letters_list_idx
// (a key's: ferry_dead_letters_key_idx, migration 12) in order and stops at
// the page's end. Before migration 8 it walked the
// index on failed_at and sorted each failure time's rows by event ID (a
// temp B-tree for the last term of the ORDER BY).
func TestDeadLetterPagesWalkTheListIndex(t *testing.T) {
	t.Parallel()
	d := migrated(t)
	for key, index := range map[string]string{"": "ferry_dead_letters_list_idx", "customer-7": "ferry_dead_letters_key_idx"} {
		p := &ferrydriver.ListDeadLettersParams{Key: key}
		args := append(deadLetterArgs(p), 50, nil, "")
		all := queryPlan(t, d, listDeadLetters(p), args...)
		t.Logf("key %q:\n%s", key, all)
		require.Contains(t, all, index)
		require.NotContains(t, all, "TEMP B-TREE", "the page is read in index order, not sorted")
	}
}

// TestInboxPagesWalkAnIndex: a page of a group's events of one state, as
// the console lists them, is a range of an index read in order: the
// backlog's PENDING and FAILED rows (ferry_inbox_state_pages_idx,
// migration 12; they were all sorted before it), DEAD and DISCARDED rows
// (ferry_inbox_state_pages_idx; PROCESSED rows: their own index, with the
// order's tie-breaks).
func TestInboxPagesWalkAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migrated(t)
	// Enough rows of every state that the planner's statistics see a
	// backlog.
	_, err := d.DB().ExecContext(ctx, `
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
INSERT INTO ferry_inbox (group_name, event_id, key, seq, topic, type, payload, created_at, state, attempts, next_attempt_at, received_at, finished_at)
SELECT 'g', printf('%08d-0000-0000-0000-000000000000', i), 'k' || (i % 500), i, 't', 'T', X'7b7d', i,
       CASE i % 5 WHEN 0 THEN 'pending' WHEN 1 THEN 'failed' WHEN 2 THEN 'dead' WHEN 3 THEN 'discarded' ELSE 'processed' END, 1, i, i,
       CASE WHEN i % 5 >= 2 THEN i END
  FROM n`)
	require.NoError(t, err)
	_, err = d.DB().ExecContext(ctx, `ANALYZE`)
	require.NoError(t, err)
	for state, index := range map[ferrydriver.InboxState]string{
		ferrydriver.InboxPending: "ferry_inbox_state_pages_idx", ferrydriver.InboxFailed: "ferry_inbox_state_pages_idx",
		ferrydriver.InboxDead: "ferry_inbox_state_pages_idx", ferrydriver.InboxProcessed: "ferry_inbox_processed_pages_idx",
		ferrydriver.InboxDiscarded: "ferry_inbox_state_pages_idx",
	} {
		q, args, err := listInboxQuery(&ferrydriver.ListInboxParams{Group: "g", States: []ferrydriver.InboxState{state}, Limit: 50})
		require.NoError(t, err)
		all := queryPlan(t, d, q, args...)
		got, err := d.ListInbox(ctx, &ferrydriver.ListInboxParams{Group: "g", States: []ferrydriver.InboxState{state}, Limit: 50})
		require.NoError(t, err)
		require.Len(t, got, 50)
		t.Logf("%s:\n%s", state, all)
		require.Contains(t, all, index, state)
		{
			require.NotContains(t, all, "TEMP B-TREE", "%s: the page is read in index order, not sorted", state)
		}
	}
}

// TestInboxCountsAndReasonsUseTheirIndex: the consumers' counts by state
// and a grouping of DEAD rows by reason read ferry_inbox_state_pages_idx
// (migration 12), whose condition they repeat: SQLite uses a partial index
// only for a query that contains its condition.
func TestInboxCountsAndReasonsUseTheirIndex(t *testing.T) {
	t.Parallel()
	d := migrated(t)
	for what, q := range map[string]string{"counts": sqlInboxCounts, "reasons": sqlInboxDeadReasons} {
		all := queryPlan(t, d, q, "g", 10, 10, 10)
		t.Logf("%s:\n%s", what, all)
		require.NotContains(t, all, "SCAN ferry_inbox\n", what)
		require.Contains(t, all, "ferry_inbox_state_pages_idx", what)
	}
}

// queryPlan is SQLite's plan of q, one step a line.
func queryPlan(t *testing.T, d *Driver, q string, args ...any) string {
	t.Helper()
	rows, err := d.DB().QueryContext(context.Background(), "EXPLAIN QUERY PLAN "+q, args...)
	require.NoError(t, err)
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &notused, &detail))
		plan = append(plan, detail)
	}
	require.NoError(t, rows.Err())
	return strings.Join(plan, "\n")
}

// migrated opens a migrated database of the test's own.
func migrated(t *testing.T) *Driver {
	t.Helper()
	d, err := Open(filepath.Join(t.TempDir(), "ferry.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	_, err = d.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return d
}
