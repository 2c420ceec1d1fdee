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

// runRegistry holds the runs of the claims this driver made, by claim and
// event (an event is in as many groups as it was delivered to), until the
// run's last row finished or a minute after the claim expired (the
// expiry is the driver's clock; the server's may be behind).
type runRegistry struct {
	mu    sync.Mutex
	byRow map[claimedRow]*run
	swept time.Time
}

// claimedRow names a claimed row: its claim's token and its event.
type claimedRow struct{ token, id uuid.UUID }

// runSweepMargin is how long past its claim's expiry a run is kept.
const runSweepMargin = time.Minute

// add remembers the runs of one claim.
func (r *runRegistry) add(runs []*run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.byRow == nil {
		r.byRow = map[claimedRow]*run{}
	}
	if now.Sub(r.swept) > 10*time.Second {
		r.swept = now
		for k, x := range r.byRow {
			if now.After(x.expires.Add(runSweepMargin)) {
				delete(r.byRow, k)
			}
		}
	}
	for _, x := range runs {
		for _, id := range x.ids {
			r.byRow[claimedRow{x.token, id}] = x
		}
	}
}

// lookup returns the run of event id under claim token; false when the
// row was claimed alone, or by another driver, or its run is forgotten.
func (r *runRegistry) lookup(id, token uuid.UUID) (*run, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x, ok := r.byRow[claimedRow{token, id}]
	return x, ok
}

// forget drops a run whose last row finished.
func (r *runRegistry) forget(x *run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range x.ids {
		delete(r.byRow, claimedRow{x.token, id})
	}
}

// size is the number of rows remembered (tests).
func (r *runRegistry) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byRow)
}

// giveBackRun gives back, inside tx, the rows of key that claim token
// still holds: PENDING again, their attempt taken back (the rows of a run
// after the one whose finish ended it). They are locked first with SKIP
// LOCKED, so that it never waits: a row another transaction holds is one
// that transaction is finishing or retracting, or gives back itself.
func giveBackRun(ctx context.Context, tx *sql.Tx, group, key string, token uuid.UUID) error {
	rows, err := tx.QueryContext(ctx, `SELECT pos FROM ferry_inbox FORCE INDEX (ferry_inbox_head_idx)
 WHERE group_name = ? AND k = ? AND state = 'processing' AND claim_token = ? FOR UPDATE SKIP LOCKED`, group, key, token[:])
	if err != nil {
		return err
	}
	var positions []any
	for rows.Next() {
		var pos int64
		if err := rows.Scan(&pos); err != nil {
			rows.Close()
			return err
		}
		positions = append(positions, pos)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(positions) == 0 {
		return err
	}
	_, err = tx.ExecContext(ctx, `UPDATE ferry_inbox
   SET state = 'pending', attempts = GREATEST(attempts - 1, 0), claimed_by = NULL, claim_token = NULL, claim_expires_at = NULL
 WHERE pos IN (`+marks(len(positions))+`)`, positions...)
	return err
}
