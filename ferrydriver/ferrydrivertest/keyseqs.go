package ferrydrivertest

import (
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/stretchr/testify/require"
)

// keySeqStore returns s as a ferrydriver.KeySeqStore, or logs that its
// producers number events themselves (the tests of PruneKeys cover them).
func keySeqStore(t *testing.T, s ferrydriver.Store) (ferrydriver.KeySeqStore, bool) {
	ks, ok := s.(ferrydriver.KeySeqStore)
	if !ok {
		t.Logf("%s's producers number events: the relay keeps no key sequences", s.Name())
	}
	return ks, ok
}

// testKeySeqs: the relay's numbers are saved with its checkpoint, fenced
// as the checkpoint is, per feed; PruneKeySeqs forgets the idle ones but
// those kept, a chunk at a time.
func testKeySeqs[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	drv := h.New(t)
	ks, ok := keySeqStore(t, drv)
	if !ok {
		return
	}
	const feed = "seqs/0"
	load := func(feed string, keys ...string) map[string]int64 {
		t.Helper()
		got, err := ks.LoadKeySeqs(ctx, feed, keys)
		require.NoError(t, err)
		return got
	}
	save := func(holder string, term int64, seqs map[string]int64) error {
		return drv.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: feed, Cursor: []byte("c"), Holder: holder, Term: term, Seqs: seqs})
	}
	require.Empty(t, load(feed, "x"), "a feed never saved has no numbers")
	a, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, save("a", a.Term, map[string]int64{"x": 3, "y": 1}))
	require.Equal(t, map[string]int64{"x": 3, "y": 1}, load(feed, "x", "y", "z"))
	require.Empty(t, load("other/0", "x"), "numbers are the feed's")

	// a loses its lease to b: a's late save writes neither its cursor nor its numbers.
	require.NoError(t, drv.ReleaseLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "a", Term: a.Term}))
	b, err := drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: feed, Holder: "b", TTL: time.Minute})
	require.NoError(t, err)
	require.ErrorIs(t, save("a", a.Term, map[string]int64{"x": 9}), ferrydriver.ErrLeaseLost)
	require.Equal(t, map[string]int64{"x": 3}, load(feed, "x"))
	require.NoError(t, save("b", b.Term, map[string]int64{"x": 4}))
	require.Equal(t, map[string]int64{"x": 4, "y": 1}, load(feed, "x", "y"))

	prune := func(idle time.Duration, after string, limit int, keep ...string) *ferrydriver.PruneKeySeqsResult {
		t.Helper()
		res, err := ks.PruneKeySeqs(ctx, &ferrydriver.PruneKeySeqsParams{Feed: feed, IdleFor: idle, After: after, Limit: limit, Keep: keep})
		require.NoError(t, err)
		return res
	}
	res := prune(time.Hour, "", 100)
	require.Empty(t, res.Pruned, "no key has been idle for an hour")
	time.Sleep(h.ClockGrain + 5*time.Millisecond)
	res = prune(0, "", 100, "y")
	require.Equal(t, []string{"x"}, res.Pruned, "idle keys go, but those kept")
	require.Empty(t, res.Next, "one call swept every key")
	require.Equal(t, map[string]int64{"y": 1}, load(feed, "x", "y"))

	// A sweep looks at Limit keys a call and says where it goes on.
	seqs := map[string]int64{}
	for i := range 7 {
		seqs["k"+strconv.Itoa(i)] = 1
	}
	require.NoError(t, save("b", b.Term, seqs))
	time.Sleep(h.ClockGrain + 5*time.Millisecond)
	calls, after, pruned := 0, "", 0
	for {
		res := prune(0, after, 3, "y")
		calls++
		pruned += len(res.Pruned)
		if res.Next == "" {
			break
		}
		require.Greater(t, res.Next, after, "the sweep moves on")
		after = res.Next
		require.Less(t, calls, 10)
	}
	require.Equal(t, 3, calls, "8 keys, 3 per call")
	require.Equal(t, 7, pruned)
}
