package ferrymysql

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/google/uuid"
)

// A claim takes a run of a key's rows (ClaimInboxParams.PerKey): its head
// and the PENDING rows after it, in order, up to the first row that cannot
// run now. They are PROCESSING under the claim's token, and the key stays
// claimed (due at the claim's expiry) while the caller runs them, each in
// a transaction of its own. A finish with Keep leaves the key alone; the
// run's last finish makes it due; a finish without Keep, or a failure,
// before the run's end gives the run's remaining rows back (PENDING,
// uncounted) in the finish's transaction, and makes the key due. Which rows
// belong to a run is kept in the driver's memory (runRegistry), so that
// the finish of a head claimed alone, the common case without a backlog,
// costs no statement more than before runs. A finish by another driver
// than the claim's, or one run again after its entry was forgotten, gives
// nothing back: the run's remaining rows are rescued after the claim
// expires, one at a time, as after a crash.

// run is one key's run of claimed rows.
type run struct {
	token   uuid.UUID
	key     string
	ids     []uuid.UUID
	expires time.Time
}

func (r *run) last() uuid.UUID { return r.ids[len(r.ids)-1] }

// runRegistry holds the runs of the claims this driver made, by event,
// until the run's last row finished or the claim expired.
type runRegistry struct {
	mu    sync.Mutex
	byRow map[uuid.UUID]*run
	swept time.Time
}

// add remembers the runs of one claim.
func (r *runRegistry) add(runs []*run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.byRow == nil {
		r.byRow = map[uuid.UUID]*run{}
	}
	if now.Sub(r.swept) > 10*time.Second {
		r.swept = now
		for id, x := range r.byRow {
			if now.After(x.expires) {
				delete(r.byRow, id)
			}
		}
	}
	for _, x := range runs {
		for _, id := range x.ids {
			r.byRow[id] = x
		}
	}
}

// lookup returns the run of event id under claim token; false when the
// row was claimed alone, or by another driver, or its run is forgotten.
func (r *runRegistry) lookup(id, token uuid.UUID) (*run, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x, ok := r.byRow[id]
	if !ok || x.token != token {
		return nil, false
	}
	return x, true
}

// forget drops a run whose last row finished.
func (r *runRegistry) forget(x *run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range x.ids {
		if r.byRow[id] == x {
			delete(r.byRow, id)
		}
	}
}

// size is the number of rows remembered (tests).
func (r *runRegistry) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byRow)
}

// sqlGiveBackRun makes the rows of a key that a claim still holds PENDING
// again, their attempt taken back: the rows of a run after the one whose
// finish ended it.
const sqlGiveBackRun = `
UPDATE ferry_inbox FORCE INDEX (ferry_inbox_head_idx)
   SET state = 'pending', attempts = GREATEST(attempts - 1, 0), claimed_by = NULL, claim_token = NULL, claim_expires_at = NULL
 WHERE group_name = ? AND k = ? AND state = 'processing' AND claim_token = ?`

// giveBackRun gives back, inside tx, the rows of key that claim token
// still holds.
func giveBackRun(ctx context.Context, tx *sql.Tx, group, key string, token uuid.UUID) error {
	_, err := tx.ExecContext(ctx, sqlGiveBackRun, group, key, token[:])
	return err
}
