package ferry

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// maxCachedSeqs bounds the keys whose last Seq a leadership keeps in
// memory; beyond it, the keys whose numbers are saved are forgotten and
// read again from the store when their next event comes.
const maxCachedSeqs = 100_000

// keySeqs numbers the events a feed returns without a Seq (stores that
// implement ferrydriver.KeySeqStore), one leadership's worth: each key's
// events get the next numbers after its last, in the order the feed
// returns them, which is the key's commit order. A key's last number comes
// from the store (what was saved with the checkpoint the leadership started
// from) the first time the leadership meets the key, and from memory after
// that. Numbering is deterministic: a leader that reads again from a
// checkpoint gives each event the number an earlier leader gave it.
type keySeqs struct {
	store ferrydriver.KeySeqStore // nil: the store's feeds number events
	feed  string
	last  map[string]seqMark
	// batch counts numbered batches; saved is the last batch whose numbers
	// the store has (the checkpointer's, atomic).
	batch uint64
	saved *atomic.Uint64
}

// seqMark is a key's last number and the batch that gave it.
type seqMark struct {
	seq   int64
	batch uint64
}

func newKeySeqs(store ferrydriver.Store, feed string, saved *atomic.Uint64) *keySeqs {
	ks, _ := store.(ferrydriver.KeySeqStore)
	return &keySeqs{store: ks, feed: feed, last: map[string]seqMark{}, saved: saved}
}

// number gives b's events without a Seq their numbers, and returns the
// batch's number and the last Seq it gave each key (nil if none).
func (s *keySeqs) number(ctx context.Context, b *ferrydriver.Batch) (uint64, map[string]int64, error) {
	var unknown []string
	for _, ev := range b.Events {
		if ev.Seq != 0 {
			continue
		}
		if _, ok := s.last[ev.Key]; !ok {
			if s.store == nil {
				return 0, nil, fmt.Errorf("ferry: the feed returned event %s without a Seq, and the store keeps no key sequences (a driver bug)", ev.ID)
			}
			s.last[ev.Key] = seqMark{} // asked once
			unknown = append(unknown, ev.Key)
		}
	}
	if len(unknown) > 0 {
		loaded, err := s.store.LoadKeySeqs(ctx, s.feed, unknown)
		if err != nil {
			for _, k := range unknown {
				delete(s.last, k)
			}
			return 0, nil, fmt.Errorf("load key sequences: %w", err)
		}
		for k, n := range loaded {
			s.last[k] = seqMark{seq: n}
		}
	}
	s.batch++
	var given map[string]int64
	for _, ev := range b.Events {
		if ev.Seq != 0 {
			continue
		}
		m := s.last[ev.Key]
		ev.Seq = m.seq + 1
		s.last[ev.Key] = seqMark{seq: ev.Seq, batch: s.batch}
		if given == nil {
			given = map[string]int64{}
		}
		given[ev.Key] = ev.Seq
	}
	s.trim()
	return s.batch, given, nil
}

// trim forgets, past maxCachedSeqs keys, those whose numbers the store has.
func (s *keySeqs) trim() {
	if len(s.last) <= maxCachedSeqs {
		return
	}
	saved := s.saved.Load()
	for k, m := range s.last {
		if m.batch <= saved {
			delete(s.last, k)
		}
	}
}

// keepSeqs merges a later batch's numbers into seqs.
func keepSeqs(seqs *map[string]int64, later map[string]int64) {
	if len(later) == 0 {
		return
	}
	if *seqs == nil {
		*seqs = make(map[string]int64, len(later))
	}
	for k, n := range later {
		(*seqs)[k] = max((*seqs)[k], n)
	}
}
