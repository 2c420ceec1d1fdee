package ferrydrivertest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// testSavepoints: a transaction that takes savepoints (as ORMs and nested
// transaction helpers do) delivers exactly what it committed, each key in
// order with gapless sequences: what it appended inside a savepoint it
// released, or still held at its commit, is delivered; what it rolled
// back to a savepoint (nested ones included) never is. A feed stopped
// after any of its events, inside a savepoint among them, resumes there.
func testSavepoints[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 3*time.Minute)
	drv := h.New(t)
	tx := h.Begin(ctx, t, drv)
	if tx.Exec == nil {
		_ = tx.Rollback()
		t.Logf("%s: the harness runs no statements in a transaction (no savepoints): not checked", drv.Name())
		return
	}
	var want []*ferryevent.Event
	step := func(keep bool, stmts ...string) {
		t.Helper()
		for _, s := range stmts {
			require.NoError(t, tx.Exec(s), s)
		}
		if !keep {
			return
		}
		for _, key := range []string{"a", "b"} {
			ev := Event("t", key, key+"-"+time.Now().Format(time.RFC3339Nano))
			require.NoError(t, drv.AppendTx(ctx, tx.Tx, []*ferryevent.Event{ev}))
			want = append(want, ev)
		}
	}
	undone := func(stmts ...string) {
		t.Helper()
		for _, s := range stmts {
			require.NoError(t, tx.Exec(s), s)
		}
		for _, key := range []string{"a", "b"} {
			require.NoError(t, drv.AppendTx(ctx, tx.Tx, []*ferryevent.Event{Event("t", key, "rolled back")}))
		}
	}
	step(true)
	step(true, "SAVEPOINT s1")
	step(false, "RELEASE SAVEPOINT s1")
	undone("SAVEPOINT s2")
	step(true, "ROLLBACK TO SAVEPOINT s2")
	undone("SAVEPOINT outer_sp")
	undone("SAVEPOINT inner_sp")
	step(true, "ROLLBACK TO SAVEPOINT outer_sp")
	step(true, "SAVEPOINT s3") // still open at the commit
	require.NoError(t, tx.Commit())
	after := []*ferryevent.Event{Event("t", "a", "after"), Event("t", "b", "after")}
	emit(ctx, t, h, drv, after...)
	want = append(want, after...)
	RequireEveryStop(ctx, t, drv, want)
}

// RequireEveryStop checks that partition 0 of s delivers want (each key in
// order, its sequence numbers increasing by one, nothing else) to a
// reader from the feed's start, and to a reader that stops after any
// number of its events and a new one that resumes from the cursor it
// left.
func RequireEveryStop(ctx context.Context, t *testing.T, s ferrydriver.Store, want []*ferryevent.Event) {
	t.Helper()
	for stop := 0; stop <= len(want); stop++ {
		r := OpenReader(ctx, t, s, nil)
		var got []*ferryevent.Event
		for len(got) < stop {
			b, err := r.Read(ctx, &ferrydriver.ReadParams{Max: 1, Wait: 50 * time.Millisecond})
			require.NoError(t, err, "stop after %d: read", stop)
			got = append(got, b.Events...)
			r.Last = b.Cursor
		}
		require.NoError(t, r.Feed.Close())
		rest := r.Resume(ctx, s)
		got = append(got, rest.ReadQuiet(ctx)...)
		require.NoError(t, rest.Feed.Close())
		require.Equal(t, ids(want), ids(sortByKeyOrder(want, got)), "stop after %d of %d events: every committed event once, each key in order, nothing rolled back", stop, len(want))
		next := map[string]int64{}
		for _, ev := range sortByKeyOrder(want, got) {
			if n, ok := next[ev.Key]; ok {
				require.Equal(t, n, ev.Seq, "stop after %d: key %s's sequence has a gap or repeats", stop, ev.Key)
			}
			next[ev.Key] = ev.Seq + 1
		}
	}
}
