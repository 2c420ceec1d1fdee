package ferry

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// maxCachedSeqs bounds the keys whose last Seq a leadership keeps in
// memory; beyond it, the keys whose numbers are saved are forgotten and
// read again from the store when their next event comes.
const maxCachedSeqs = 100_000

// seqPruneChunk is how many keys one PruneKeySeqs call looks at: the
// numbering goroutine runs one call between two reads, so that forgetting
// idle keys never holds reading up for long.
const seqPruneChunk = 500

// keySeqs numbers the events a feed returns without a Seq (stores that
// implement ferrydriver.KeySeqStore), one leadership's worth: each key's
// events get the next numbers after its last, in the order the feed
// returns them, which is the key's commit order. A key's last number comes
// from the store (what was saved with the checkpoint the leadership started
// from) the first time the leadership meets the key, and from memory after
// that. Numbering is deterministic: a leader that reads again from a
// checkpoint gives each event the number an earlier leader gave it.
//
// It is used by the goroutine that reads the feed only, which also
// forgets idle keys (prune), so that no key is forgotten between the
// moment it is numbered and the moment its number is saved.
type keySeqs struct {
	store ferrydriver.KeySeqStore // nil: the store's feeds number events
	feed  string
	last  map[string]seqMark
	// batch counts numbered batches; saved is the last batch whose numbers
	// the store has (the checkpointer's, atomic); unsaved lists the keys
	// each batch after it numbered.
	batch   uint64
	saved   *atomic.Uint64
	unsaved []batchKeys

	// Forgetting idle keys (RelayConfig.KeyRetention; idle < 0: never):
	// a pass every `every`, one chunk between two reads, from the first
	// key to the last; pruned reports each pass.
	idle, every time.Duration
	passAt      time.Time
	sweeping    bool
	sweep       string
	forgotten   int
	pruned      func(n int, err error)
}

// seqMark is a key's last number and the batch that gave it.
type seqMark struct {
	seq   int64
	batch uint64
}

// batchKeys are the keys a batch numbered.
type batchKeys struct {
	n    uint64
	keys []string
}

func newKeySeqs(store ferrydriver.Store, feed string, saved *atomic.Uint64) *keySeqs {
	ks, _ := store.(ferrydriver.KeySeqStore)
	return &keySeqs{store: ks, feed: feed, last: map[string]seqMark{}, saved: saved, idle: -1, pruned: func(int, error) {}}
}

// number gives b's events without a Seq their numbers, and returns the
// batch's number and the last Seq of each key in the batch (nil if none).
// An event that has a Seq (its producer numbered it: written before the
// store left numbering to the relay) keeps it, and its key's next event
// goes on from it.
func (s *keySeqs) number(ctx context.Context, b *ferrydriver.Batch) (uint64, map[string]int64, error) {
	s.batch++
	if s.store == nil {
		for _, ev := range b.Events {
			if ev.Seq == 0 {
				return 0, nil, fmt.Errorf("ferry: the feed returned event %s without a Seq, and the store does not keep key sequences: a store that leaves Seq to the relay implements ferrydriver.KeySeqStore, and so must a type that wraps it", ev.ID)
			}
		}
		return s.batch, nil, nil
	}
	if err := s.load(ctx, b.Events); err != nil {
		s.batch--
		return 0, nil, err
	}
	var given map[string]int64
	for _, ev := range b.Events {
		m := s.last[ev.Key]
		if ev.Seq == 0 {
			ev.Seq = m.seq + 1
		} else if ev.Seq <= m.seq {
			continue
		}
		s.last[ev.Key] = seqMark{seq: ev.Seq, batch: s.batch}
		if given == nil {
			given = map[string]int64{}
		}
		given[ev.Key] = ev.Seq
	}
	s.dropSaved()
	if len(given) > 0 {
		keys := make([]string, 0, len(given))
		for k := range given {
			keys = append(keys, k)
		}
		s.unsaved = append(s.unsaved, batchKeys{n: s.batch, keys: keys})
	}
	s.trim()
	return s.batch, given, nil
}

// load reads from the store the last numbers of the keys of events that
// this leadership has not met yet.
func (s *keySeqs) load(ctx context.Context, events []*ferryevent.Event) error {
	var unknown []string
	for _, ev := range events {
		if _, ok := s.last[ev.Key]; !ok {
			s.last[ev.Key] = seqMark{} // asked once
			unknown = append(unknown, ev.Key)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	loaded, err := s.store.LoadKeySeqs(ctx, s.feed, unknown)
	if err != nil {
		for _, k := range unknown {
			delete(s.last, k)
		}
		return fmt.Errorf("load key sequences: %w", err)
	}
	for k, n := range loaded {
		s.last[k] = seqMark{seq: n}
	}
	return nil
}

// dropSaved forgets the key lists of the batches whose numbers are saved.
func (s *keySeqs) dropSaved() {
	saved := s.saved.Load()
	i := 0
	for i < len(s.unsaved) && s.unsaved[i].n <= saved {
		i++
	}
	s.unsaved = append(s.unsaved[:0], s.unsaved[i:]...)
}

// keep returns the keys whose numbers are not saved yet.
func (s *keySeqs) keep() []string {
	s.dropSaved()
	var keep []string
	for _, b := range s.unsaved {
		keep = append(keep, b.keys...)
	}
	return keep
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

// prune forgets the saved numbers of a chunk of keys idle for s.idle
// (ferrydriver.KeySeqStore.PruneKeySeqs), here and in the store, while a
// pass is under way; a pass starts every s.every and sweeps the feed's
// keys in order. The keys whose numbers are not saved yet are kept.
func (s *keySeqs) prune(ctx context.Context) {
	if s.store == nil || s.idle < 0 {
		return
	}
	if !s.sweeping {
		if time.Since(s.passAt) < s.every {
			return
		}
		s.passAt, s.sweeping, s.sweep, s.forgotten = time.Now(), true, "", 0
	}
	res, err := s.store.PruneKeySeqs(ctx, &ferrydriver.PruneKeySeqsParams{Feed: s.feed, IdleFor: s.idle, After: s.sweep, Limit: seqPruneChunk, Keep: s.keep()})
	if err != nil {
		s.sweeping = false // the next pass starts over
		if ctx.Err() == nil {
			s.pruned(s.forgotten, err)
		}
		return
	}
	for _, k := range res.Pruned {
		delete(s.last, k)
	}
	s.forgotten += len(res.Pruned)
	s.sweep = res.Next
	if res.Next == "" {
		s.sweeping = false
		s.pruned(s.forgotten, nil)
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

// keySeqs returns a leadership's numbering, forgetting keys idle for
// KeyRetention every RetentionInterval.
func (r *Relay) keySeqs(saved *atomic.Uint64) *keySeqs {
	s := newKeySeqs(r.store, r.name, saved)
	s.idle, s.every = r.cfg.KeyRetention, r.cfg.RetentionInterval
	s.pruned = func(n int, err error) {
		if n > 0 {
			r.m.removed.WithLabelValues("keys").Add(float64(n))
			r.log.Debug("ferry: forgot idle keys", "count", n, "idle_for", r.cfg.KeyRetention)
		}
		if err != nil {
			r.log.Warn("ferry: forgetting idle keys failed; will retry", "err", err)
		}
	}
	return s
}
