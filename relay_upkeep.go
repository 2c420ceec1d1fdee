package ferry

import (
	"context"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// The relay's retention pass, beside retain (relay.go): everything it
// removes goes in bounded chunks read by index, so that a pass costs the
// same however much history the tables hold.

// retentionChunk is how many rows one retention statement removes at most.
const retentionChunk = 5000

// retains reports whether the retention pass has anything to do.
func (r *Relay) retains() bool {
	return r.cfg.Retention >= 0 || r.cfg.DeadLetterRetention >= 0
}

// retainDeadLetters removes the feed's dead letters older than
// DeadLetterRetention, a chunk at a time, until a chunk comes back short.
func (r *Relay) retainDeadLetters(ctx context.Context) {
	if r.cfg.DeadLetterRetention < 0 {
		return
	}
	total := int64(0)
	for ctx.Err() == nil {
		n, err := r.store.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: r.name, OlderThan: r.cfg.DeadLetterRetention, Limit: retentionChunk})
		if err != nil {
			r.log.Warn("ferry: retention of dead letters failed; will retry", "err", err)
			return
		}
		total += n
		if n < retentionChunk {
			break
		}
	}
	if total > 0 {
		r.m.removed.WithLabelValues("dead_letters").Add(float64(total))
		r.log.Info("ferry: removed expired dead letters", "count", total, "older_than", r.cfg.DeadLetterRetention)
	}
}
