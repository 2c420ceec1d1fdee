package ferrymysql_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
	"github.com/ferry-dev/ferry/ferryevent"
)

// TestFeedFollowsAFailover: a relay reads the primary and saves its
// checkpoint inside a large transaction; a replica applies all of it and
// is promoted; a relay on the replica resumes from the replicated
// checkpoint and delivers exactly what came after it, each event once and
// each key in order, then the new primary's own events. The replica's
// binlog files and offsets are not the primary's: only the checkpoint's
// GTID position names the same place on both. And the replica's own
// transaction (another GTID domain) comes first in its binlog: the rows
// the checkpoint says were delivered are skipped in the transaction it
// names, not in the first one the new primary sends.
func TestFeedFollowsAFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A topology of the test's own: the shared server's other databases
	// (other tests') cannot be replicated, and a replica that skips some
	// of the primary's transactions lacks their GTIDs.
	primarySrv := mysqltest.StartServer(t, 1)
	replica := mysqltest.StartReplica(t, primarySrv)
	_, err := primarySrv.Admin.ExecContext(ctx, `CREATE DATABASE ferry_failover`)
	require.NoError(t, err)
	primary := mysqltest.Open(t, primarySrv.DSN("ferry_failover"), nil, true)

	first := emitN(ctx, t, primary, 40, 4, "first-")
	var big []*ferryevent.Event
	for j := range 30 {
		big = append(big, ferrydrivertest.Event("t", "k"+strconv.Itoa(j%5), "big-"+strconv.Itoa(j)))
	}
	require.NoError(t, primary.Append(ctx, big))

	// The old primary's relay: 50 events, the last batch ending inside
	// the large transaction.
	r := ferrydrivertest.OpenReader(ctx, t, primary, nil)
	var got []*ferryevent.Event
	for len(got) < 50 {
		b, err := r.Feed.Read(ctx, &ferrydriver.ReadParams{Max: 50 - len(got), Wait: 50 * time.Millisecond})
		require.NoError(t, err)
		got = append(got, b.Events...)
		r.Last = b.Cursor
	}
	requireKeyOrder(t, append(first, big[:10]...), got)
	require.Contains(t, string(r.Last), `"gtid":"0-1-`, "the cursor holds the GTID position")
	require.Contains(t, string(r.Last), `"skip":10,"skip_tx":"0-1-`, "the cursor names the transaction it is inside")
	lease, err := primary.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "test/0", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, primary.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: "test/0", Cursor: r.Last, Holder: "a", Term: lease.Term}))
	require.NoError(t, r.Feed.Close())
	rest := emitN(ctx, t, primary, 50, 7, "rest-")

	replica.CatchUp(t, primarySrv)
	replica.Promote(t)
	promoted := mysqltest.Open(t, replica.DSN("ferry_failover"), nil, false)
	cp, err := promoted.LoadCheckpoint(ctx, "test/0")
	require.NoError(t, err)
	require.JSONEq(t, string(r.Last), string(cp.Cursor), "the checkpoint was replicated")

	rr := ferrydrivertest.OpenReader(ctx, t, promoted, cp.Cursor)
	requireKeyOrder(t, append(big[10:], rest...), rr.ReadN(ctx, 70))
	require.Empty(t, rr.ReadQuiet(ctx), "nothing twice")
	own := emitN(ctx, t, promoted, 10, 3, "own-")
	requireKeyOrder(t, own, rr.ReadN(ctx, 10))
	require.Contains(t, string(rr.Last), `"gtid":"0-2-`, "the cursor follows the new primary's GTIDs")
}
