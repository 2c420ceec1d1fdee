package ferry

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

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
	b.Events = append(b.Events, &ferryevent.Event{Key: "c", Seq: 9}) // numbered by its producer: kept, not asked
	_, given, err = s.number(ctx, b)
	require.NoError(t, err)
	require.Equal(t, []int64{44, 2, 9}, []int64{b.Events[0].Seq, b.Events[1].Seq, b.Events[2].Seq})
	require.Equal(t, map[string]int64{"a": 44, "b": 2}, given)
	require.Equal(t, 2, store.asked, "known keys are not asked again")

	// Fill the memory past its bound with keys of batch 3, not yet saved.
	many := make([]string, maxCachedSeqs)
	for i := range many {
		many[i] = "k" + strconv.Itoa(i)
	}
	_, _, err = s.number(ctx, unnumbered(many...))
	require.NoError(t, err)
	require.Greater(t, len(s.last), maxCachedSeqs, "numbers not saved yet are never forgotten")

	// Once batches 1 to 3 are saved, the next batch forgets them.
	saved.Store(3)
	store.saved["a"] = 44
	_, _, err = s.number(ctx, unnumbered("d"))
	require.NoError(t, err)
	require.Len(t, s.last, 1, "saved numbers are forgotten past the bound")
	asked := store.asked
	b = unnumbered("a")
	_, _, err = s.number(ctx, b)
	require.NoError(t, err)
	require.EqualValues(t, 45, b.Events[0].Seq, "a forgotten key goes on from its saved number")
	require.Equal(t, asked+1, store.asked)
}

// TestKeySeqsNeedAStoreThatKeepsThem: an unnumbered event from a store that
// keeps no key sequences is a driver's bug, said as such.
func TestKeySeqsNeedAStoreThatKeepsThem(t *testing.T) {
	var saved atomic.Uint64
	s := newKeySeqs(struct{ ferrydriver.Store }{}, "default/0", &saved)
	_, _, err := s.number(context.Background(), unnumbered("a"))
	require.ErrorContains(t, err, "keeps no key sequences")
	b := &ferrydriver.Batch{Events: []*ferryevent.Event{{Key: "a", Seq: 3}}}
	_, given, err := s.number(context.Background(), b)
	require.NoError(t, err)
	require.Nil(t, given, "events numbered by their producer need nothing")
}
