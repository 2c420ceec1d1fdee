package ferry

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// checkpointer saves the newest cursor handed to it, off the publish path,
// and at least every HeartbeatInterval.
type checkpointer struct {
	r    *Relay
	term int64
	lose context.CancelCauseFunc
	wake chan struct{}

	mu sync.Mutex // guards the fields below
	// latest is the newest cursor, offered the number of events delivered
	// up to it; saved and savedEvents what the store has.
	latest, saved        []byte
	offered, savedEvents int64
	// seqs are the keys' last Seqs the relay gave up to latest and not yet
	// saved; latestBatch numbers latest's batch (readResult.n).
	seqs        map[string]int64
	latestBatch uint64
	// progress is closed and replaced after every save.
	progress chan struct{}

	// savedBatch is the last batch whose Seqs the store has (keySeqs).
	savedBatch atomic.Uint64
}

func newCheckpointer(r *Relay, term int64, saved []byte, lose context.CancelCauseFunc) *checkpointer {
	return &checkpointer{r: r, term: term, lose: lose, wake: make(chan struct{}, 1), saved: saved, latest: saved, progress: make(chan struct{})}
}

// offer records the cursor up to which every event was delivered, events
// more than the previous one, with the batch it ends (n) and the Seqs the
// relay gave since the previous offer. Delivered events wake the saver; an
// empty stretch's cursor waits for the next heartbeat.
func (c *checkpointer) offer(cursor []byte, events int, n uint64, seqs map[string]int64) {
	c.mu.Lock()
	c.latest = cursor
	c.offered += int64(events)
	c.latestBatch = max(c.latestBatch, n)
	keepSeqs(&c.seqs, seqs)
	c.mu.Unlock()
	if events == 0 {
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// unsaved returns how many delivered events the store's checkpoint has not
// passed yet: what a crash now would redeliver on top of the pipeline.
func (c *checkpointer) unsaved() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.offered - c.savedEvents)
}

// progressed returns a channel closed at the next save.
func (c *checkpointer) progressed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.progress
}

func (c *checkpointer) savedCursor() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.saved
}

// saveGap is the least time between two saves while events keep coming,
// unless a batch's worth waits: at a moderate rate every batch is a few
// events, and a save for each cost the database as much as reading them
// (a statement, a commit, and a row per key for the relay's Seqs). A crash
// redelivers at most this much more, which consumers skip.
const saveGap = 20 * time.Millisecond

// spaced waits until saveGap after savedAt, or less if a batch's worth
// of delivered events is unsaved, then or as later offers make it so (the
// pipeline stops reading at two). It reports false if ctx ended.
func (c *checkpointer) spaced(ctx context.Context, savedAt time.Time) bool {
	wait := time.Until(savedAt.Add(saveGap))
	if wait <= 0 || c.unsaved() >= c.r.cfg.BatchSize {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-c.wake:
			if c.unsaved() >= c.r.cfg.BatchSize {
				return true
			}
		}
	}
}

func (c *checkpointer) run(ctx context.Context) {
	hb := time.NewTicker(c.r.cfg.HeartbeatInterval)
	defer hb.Stop()
	retry := 0
	var savedAt time.Time
	for {
		heartbeat := false
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
			if !c.spaced(ctx, savedAt) {
				return
			}
		case <-hb.C:
			heartbeat = true
		}
		savedAt = time.Now()
		if err := c.save(ctx, heartbeat); err != nil && ctx.Err() == nil {
			retry++
			c.r.log.Warn("ferry: saving the checkpoint failed; will retry", "err", err, "attempt", retry)
			c.r.retry.Sleep(ctx.Done(), retry)
			select {
			case c.wake <- struct{}{}:
			default:
			}
			continue
		}
		retry = 0
	}
}

// save stores the latest cursor if it changed (or always, for a heartbeat,
// which also shows operators that the relay is alive).
func (c *checkpointer) save(ctx context.Context, heartbeat bool) error {
	c.mu.Lock()
	cur, seq, saved, seqs, batch := c.latest, c.offered, c.saved, c.seqs, c.latestBatch
	c.seqs = nil
	c.mu.Unlock()
	if cur == nil || (!heartbeat && len(seqs) == 0 && bytes.Equal(cur, saved)) {
		c.markSaved(cur, seq)
		return nil
	}
	err := c.r.store.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: c.r.name, Partition: c.r.cfg.Partition, Cursor: cur, Holder: c.r.holder, Term: c.term, Seqs: seqs})
	if errors.Is(err, ferrydriver.ErrLeaseLost) {
		c.lose(err)
		return nil
	}
	if err != nil {
		// They go with the next save, merged with what was offered meanwhile.
		c.mu.Lock()
		keepSeqs(&seqs, c.seqs)
		c.seqs = seqs
		c.mu.Unlock()
		return err
	}
	c.savedBatch.Store(batch)
	c.r.m.checkpoints.Inc()
	c.r.progress.Add(1)
	c.markSaved(cur, seq)
	return nil
}
