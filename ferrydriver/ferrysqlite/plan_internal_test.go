package ferrysqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/stretchr/testify/require"
)

// TestDeadLetterPagesWalkTheListIndex: a page of dead letters, as the
// console and `ferry dlq list` ask for it, reads ferry_dead_letters_list_idx
// in order and stops at the page's end. Before migration 8 it walked the
// index on failed_at and sorted each failure time's rows by event ID (a
// temp B-tree for the last term of the ORDER BY).
func TestDeadLetterPagesWalkTheListIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, err := Open(filepath.Join(t.TempDir(), "ferry.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	_, err = d.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	args := append(deadLetterArgs("", "", "", "", time.Time{}, time.Time{}, nil, 50), nil, "")
	rows, err := d.DB().QueryContext(ctx, "EXPLAIN QUERY PLAN "+sqlListDeadLetters, args...)
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
	all := strings.Join(plan, "\n")
	t.Log(all)
	require.Contains(t, all, "ferry_dead_letters_list_idx")
	require.NotContains(t, all, "TEMP B-TREE", "the page is read in index order, not sorted")
}
