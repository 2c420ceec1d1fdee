package ferrypg

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestPartitionsUndeliveredIsCountedByIndex: SetPartitions' count of what
// a feed has not delivered reads the events since the feed's cursor
// through outbox_xid_idx, not the outbox (see sqlUndelivered).
func TestPartitionsUndeliveredIsCountedByIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newTestDriver(t)
	pool := ferrypgtest.Pool(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.outbox (event_id, topic, key, seq, type, payload, created_at)
		SELECT gen_random_uuid(), 't', 'k' || g, 0, 'T', '', now() FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	r := ferrydrivertest.OpenReader(ctx, t, drv, nil)
	r.ReadQuiet(ctx)
	more := ferrydrivertest.Event("t", "k", "undelivered")
	require.NoError(t, drv.Append(ctx, []*ferryevent.Event{more}))

	st, err := decodeCursor(r.Last)
	require.NoError(t, err)
	require.True(t, st.Done)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, sqlIndexPlans)
	require.NoError(t, err)
	args := []any{0, strconv.FormatUint(st.CurXmax, 10), xidStrings(st.CurXip), st.Done, st.After,
		strconv.FormatUint(st.CurXmax, 10), xidStrings(st.CurXip), undeliveredLimit}
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) "+drv.queries.undelivered, args...)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(plan, "\n")
	t.Log(text)
	require.Contains(t, text, "outbox_xid_idx")
	require.NotContains(t, text, "Seq Scan")
	require.NotContains(t, text, "outbox_pkey")
	var n int64
	require.NoError(t, tx.QueryRow(ctx, drv.queries.undelivered, args...).Scan(&n))
	require.EqualValues(t, 1, n, "the event appended after the feed's last read")
}
