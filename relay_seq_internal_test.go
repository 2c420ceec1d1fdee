package ferry

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
)

// savedSeqs is a store whose saved key sequences are a map.
type savedSeqs struct {
	ferrydriver.Store
	saved map[string]int64
	asked int
}

func (s *savedSeqs) LoadKeySeqs(_ context.Context, _ string, keys []string) (map[string]int64, error) {
	s.asked += len(keys)
	out := map[string]int64{}
	for _, k := range keys {
		if n, ok := s.saved[k]; ok {
			out[k] = n
		}
	}
	return out, nil
}

// PruneKeySeqs forgets every saved key but those kept, in one chunk.
func (s *savedSeqs) PruneKeySeqs(_ context.Context, p *ferrydriver.PruneKeySeqsParams) (*ferrydriver.PruneKeySeqsResult, error) {
	res := &ferrydriver.PruneKeySeqsResult{}
	for k := range s.saved {
		if !slices.Contains(p.Keep, k) {
			delete(s.saved, k)
			res.Pruned = append(res.Pruned, k)
		}
	}
	return res, nil
}

func unnumbered(keys ...string) *ferrydriver.Batch {
	b := &ferrydriver.Batch{}
	for _, k := range keys {
		b.Events = append(b.Events, &ferryevent.Event{Key: k})
	}
	return b
}

// TestKeySeqsAskTheStoreOnceAKey: a key's last number is read from the
// store the first time the leadership meets it, kept in memory after; past
// maxCachedSeqs keys, those whose numbers were saved are forgotten and read
// again, those not yet saved are kept.
func TestKeySeqsAskTheStoreOnceAKey(t *testing.T) {
	ctx := context.Background()
	store := &savedSeqs{saved: map[string]int64{"a": 41}}
	var saved atomic.Uint64
	s := newKeySeqs(store, "default/0", &saved)

	b := unnumbered("a", "b", "a")
	n, given, err := s.number(ctx, b)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, []int64{42, 1, 43}, []int64{b.Events[0].Seq, b.Events[1].Seq, b.Events[2].Seq})
	require.Equal(t, map[string]int64{"a": 43, "b": 1}, given)
	require.Equal(t, 2, store.asked)

	b = unnumbered("a", "b")
	b.Events = append(b.Events, &ferryevent.Event{Key: "c", Seq: 9}, &ferryevent.Event{Key: "c"}) // numbered by its producer: kept, and c goes on from it
	_, given, err = s.number(ctx, b)
	require.NoError(t, err)
	require.Equal(t, []int64{44, 2, 9, 10}, []int64{b.Events[0].Seq, b.Events[1].Seq, b.Events[2].Seq, b.Events[3].Seq})
	require.Equal(t, map[string]int64{"a": 44, "b": 2, "c": 10}, given)
	require.Equal(t, 3, store.asked, "known keys are not asked again")

	// Fill the memory past its bound with keys of batch 3, not yet saved.
	many := make([]string, maxCachedSeqs)
	for i := range many {
		many[i] = "k" + strconv.Itoa(i)
	}
	_, _, err = s.number(ctx, unnumbered(many...))
	require.NoError(t, err)
	require.Greater(t, len(s.last), maxCachedSeqs, "numbers not saved yet are never forgotten")

	require.Len(t, s.unsaved, 3, "each batch's keys, until saved")

	// Once batches 1 to 3 are saved, the next batch forgets them.
	saved.Store(3)
	store.saved["a"] = 44
	_, _, err = s.number(ctx, unnumbered("d"))
	require.NoError(t, err)
	require.Len(t, s.last, 1, "saved numbers are forgotten past the bound")
	require.Len(t, s.unsaved, 1, "and the lists of saved batches")
	asked := store.asked
	b = unnumbered("a")
	_, _, err = s.number(ctx, b)
	require.NoError(t, err)
	require.EqualValues(t, 45, b.Events[0].Seq, "a forgotten key goes on from its saved number")
	require.Equal(t, asked+1, store.asked)
}

// TestKeySeqsForgetOnlySavedKeys: a pass forgets idle keys in the store and
// in memory, but never a key whose number is not saved yet; the next pass
// waits for its interval.
func TestKeySeqsForgetOnlySavedKeys(t *testing.T) {
	ctx := context.Background()
	store := &savedSeqs{saved: map[string]int64{"a": 5, "b": 7}}
	var saved atomic.Uint64
	s := newKeySeqs(store, "default/0", &saved)
	s.idle, s.every = time.Hour, time.Hour
	var forgotten int
	s.pruned = func(n int, err error) { require.NoError(t, err); forgotten += n }
	_, _, err := s.number(ctx, unnumbered("a"))
	require.NoError(t, err)
	_, _, err = s.number(ctx, unnumbered("b"))
	require.NoError(t, err)
	saved.Store(1) // a's 6 is saved, b's 8 is not
	store.saved["a"] = 6
	require.Equal(t, []string{"b"}, s.keep(), "the keys whose numbers are unsaved")
	s.prune(ctx)
	require.Equal(t, 1, forgotten)
	require.Equal(t, map[string]int64{"b": 7}, store.saved, "b's unsaved number keeps its key")
	require.NotContains(t, s.last, "a", "a forgotten here too")
	b := unnumbered("a", "b")
	_, _, err = s.number(ctx, b)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 9}, []int64{b.Events[0].Seq, b.Events[1].Seq}, "a starts again at 1, b goes on")
	store.saved = map[string]int64{}
	s.prune(ctx)
	require.Equal(t, 1, forgotten, "the next pass waits for its interval")
}

// TestKeySeqsNeedAStoreThatKeepsThem: an unnumbered event from a store that
// keeps no key sequences is a driver's bug, said as such.
func TestKeySeqsNeedAStoreThatKeepsThem(t *testing.T) {
	var saved atomic.Uint64
	s := newKeySeqs(struct{ ferrydriver.Store }{}, "default/0", &saved)
	_, _, err := s.number(context.Background(), unnumbered("a"))
	require.ErrorContains(t, err, "does not keep key sequences")
	b := &ferrydriver.Batch{Events: []*ferryevent.Event{{Key: "a", Seq: 3}}}
	_, given, err := s.number(context.Background(), b)
	require.NoError(t, err)
	require.Nil(t, given, "events numbered by their producer need nothing")
}
