package ferry

import (
	"context"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// The relay's retention pass, beside retain (relay.go): everything it
// removes goes in bounded chunks read by index, so that a pass costs the
// same however much history the tables hold.

// keyChunksPerPass bounds the keys one retention pass looks at: 20 chunks
// of ferrydriver.RetentionChunk, 100,000 keys a minute at the default interval.
const keyChunksPerPass = 20

// retains reports whether the retention pass has anything to do.
func (r *Relay) retains() bool {
	return r.cfg.Retention >= 0 || r.cfg.DeadLetterRetention >= 0 || r.cfg.KeyRetention >= 0
}

// keySweep is where the sweep of the keys table stands between passes
// (maintain's, so that a new term starts over).
type keySweep struct{ after string }

// pruneKeys goes on sweeping the keys table from where the last pass
// stopped, forgetting keys idle for KeyRetention whose events were all
// delivered (Store.PruneKeys), until the sweep reaches the end or the pass
// has looked at keyChunksPerPass chunks. A store whose producers leave
// Seq to the relay has no such table: the relay forgets its own numbers
// (keySeqs.prune).
func (r *Relay) pruneKeys(ctx context.Context, cursor []byte, sweep *keySweep) {
	if _, ok := r.store.(ferrydriver.KeySeqStore); ok || cursor == nil || r.cfg.KeyRetention < 0 {
		return
	}
	total := int64(0)
	for range keyChunksPerPass {
		if ctx.Err() != nil {
			break
		}
		res, err := r.store.PruneKeys(ctx, &ferrydriver.PruneKeysParams{Partition: r.cfg.Partition, Cursor: cursor,
			IdleFor: r.cfg.KeyRetention, After: sweep.after, Limit: ferrydriver.RetentionChunk})
		if err != nil {
			if ctx.Err() == nil { // a stop is not a failure
				r.log.Warn("ferry: pruning idle keys failed; will retry", "err", err)
			}
			break
		}
		total += res.Pruned
		sweep.after = res.Next
		if res.Next == "" {
			break // the end of the table: the next pass starts over
		}
	}
	if total > 0 {
		r.m.removed.WithLabelValues("keys").Add(float64(total))
		r.log.Debug("ferry: forgot idle keys", "count", total, "idle_for", r.cfg.KeyRetention)
	}
}

// retainDeadLetters removes the feed's dead letters older than
// DeadLetterRetention, a chunk at a time, until a chunk comes back short.
func (r *Relay) retainDeadLetters(ctx context.Context) {
	if r.cfg.DeadLetterRetention < 0 {
		return
	}
	total := int64(0)
	for ctx.Err() == nil {
		n, err := r.store.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: r.name, OlderThan: r.cfg.DeadLetterRetention, Limit: ferrydriver.RetentionChunk})
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("ferry: retention of dead letters failed; will retry", "err", err)
			}
			return
		}
		total += n
		if n < ferrydriver.RetentionChunk {
			break
		}
	}
	if total > 0 {
		r.m.removed.WithLabelValues("dead_letters").Add(float64(total))
		r.log.Info("ferry: removed expired dead letters", "count", total, "older_than", r.cfg.DeadLetterRetention)
	}
}
