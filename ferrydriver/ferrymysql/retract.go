package ferrymysql

import (
	"context"
	"database/sql"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// RetractInbox implements ferrydriver.Inbox, in one READ
// COMMITTED transaction: the group's rows of the events are locked (in ID
// order) and retracted, events it never received are recorded as
// retracted, the compensations of processed ones are queued at the end of
// their keys, and the keys are made due (locked last, in key order): the
// next claim reads their heads. A retraction that meets a concurrent
// delivery of an event it records (duplicate key) runs again.
func (d *Driver) RetractInbox(ctx context.Context, p *ferrydriver.RetractInboxParams) ([]ferrydriver.InboxState, error) {
	res := make([]ferrydriver.InboxState, len(p.Retractions))
	if len(p.Retractions) == 0 {
		return res, nil
	}
	op := "retract inbox rows of group " + p.Group
	var err error
	for run := 1; run <= maxInsertRuns; run++ {
		err = d.writeRC(ctx, op, func(tx *sql.Tx) error {
			clear(res)
			return d.retractTx(ctx, tx, p, res)
		})
		if errNumber(err) != errDupEntry || ctx.Err() != nil {
			break
		}
		d.duplicates.Add(1)
		time.Sleep(rerunPause(run))
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (d *Driver) retractTx(ctx context.Context, tx *sql.Tx, p *ferrydriver.RetractInboxParams, res []ferrydriver.InboxState) error {
	op := "retract inbox rows of group " + p.Group
	ids := make([]uuid.UUID, 0, len(p.Retractions))
	for _, r := range p.Retractions {
		ids = append(ids, r.Event.ID)
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return strings.Compare(string(a[:]), string(b[:])) })
	ids = slices.Compact(ids)
	prior, err := lockRows(ctx, tx, p.Group, ids)
	if err != nil {
		return d.wrapErr(op, err)
	}
	// The claims of the rows' keys, read (not locked: the keys are locked
	// after the rows, below): a PENDING or FAILED row inside one reads as
	// PROCESSING.
	var rowKeys []string
	for _, f := range prior {
		if f.state == ferrydriver.InboxPending || f.state == ferrydriver.InboxFailed {
			rowKeys = append(rowKeys, f.key)
		}
	}
	claims, err := keyClaims(ctx, tx, p.Group, rowKeys, false)
	if err != nil {
		return d.wrapErr(op, err)
	}
	var ghosts, compensations []*ferryevent.Event
	var keys []string
	var retract, charged []uuid.UUID
	cuts := map[string]int64{} // of each claimed key, its first retracted row
	done := map[uuid.UUID]bool{}
	for i, r := range p.Retractions {
		f, ok := prior[r.Event.ID]
		c, claimed := claims[f.key]
		claimed = claimed && c.covers(f)
		res[i] = f.state
		if claimed {
			res[i] = ferrydriver.InboxProcessing
		}
		if done[r.Event.ID] {
			continue
		}
		done[r.Event.ID] = true
		switch {
		case !ok:
			ghosts = append(ghosts, r.Event) // never received: recorded, then retracted
			retract = append(retract, r.Event.ID)
		case f.state != ferrydriver.InboxRetracted:
			retract = append(retract, r.Event.ID)
			keys = append(keys, f.key)
			if claimed {
				// It keeps the claim's attempt, which only its finish or
				// a rescue would have stored: InboxRow.Attempts counts the
				// row's claims.
				charged = append(charged, r.Event.ID)
				if first, ok := cuts[f.key]; !ok || f.pos < first {
					cuts[f.key] = f.pos
				}
			}
		}
		if f.state == ferrydriver.InboxProcessed && r.Compensation != nil {
			compensations = append(compensations, r.Compensation)
		}
	}
	if len(ghosts) > 0 {
		// Retracted below: their keys have nothing more to run.
		if _, err := d.insertInboxRows(ctx, tx, p.Group, ghosts, make([]bool, len(ghosts))); err != nil {
			return err
		}
	}
	if len(retract) > 0 {
		err := chunks(retract, inListChunk, func(ids []uuid.UUID) error {
			_, err := tx.ExecContext(ctx, `UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx) SET state = 'retracted', finished_at = `+sqlNow+`
 WHERE group_name = ? AND event_id IN (`+marks(len(ids))+`)`, idArgs([]any{p.Group}, ids)...)
			return err
		})
		if err != nil {
			return d.wrapErr(op, err)
		}
	}
	if len(charged) > 0 {
		err := chunks(charged, inListChunk, func(ids []uuid.UUID) error {
			_, err := tx.ExecContext(ctx, `UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx) SET attempts = attempts + 1
 WHERE group_name = ? AND event_id IN (`+marks(len(ids))+`)`, idArgs([]any{p.Group}, ids)...)
			return err
		})
		if err != nil {
			return d.wrapErr(op, err)
		}
	}
	if len(compensations) > 0 {
		more, err := d.insertInboxRows(ctx, tx, p.Group, compensations, make([]bool, len(compensations)))
		if err != nil {
			return err
		}
		keys = append(keys, more...)
	}
	// The retracted rows' keys (their heads may have gone) and the
	// compensations', in one pass in key order; then the claims that
	// covered a retracted row, cut short.
	if _, err := d.touchKeys(ctx, tx, p.Group, keys, true); err != nil {
		return err
	}
	cut := slices.Sorted(maps.Keys(cuts))
	for _, k := range cut {
		if err := cutClaim(ctx, tx, p.Group, k, claims[k].token, cuts[k]); err != nil {
			return d.wrapErr(op, err)
		}
	}
	return nil
}

// cutClaim cuts key's claim (token) short, to end just before its
// retracted row at position first: the worker running that row finds its
// claim lost there, and the rows before stay its own (no other worker
// claims them while it may be running them). A claim with nothing left to
// run (every row of it finished or retracted) ends instead, its key due
// now; one cut to nothing with rows after the cut (a batch may be running
// them) stays the worker's until it expires.
func cutClaim(ctx context.Context, tx *sql.Tx, group, key string, token []byte, first int64) error {
	if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY) SET claim_through = ?
 WHERE group_name = ? AND k = ? AND claim_token = ? AND EXISTS (
       SELECT 1 FROM ferry_inbox i FORCE INDEX (ferry_inbox_head_idx)
        WHERE i.group_name = ? AND i.k = ? AND i.state IN ('pending', 'failed') AND i.pos > claim_from AND i.pos <= claim_through)`,
		first-1, group, key, token, group, key); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys FORCE INDEX (PRIMARY) `+endClaim+`
 WHERE group_name = ? AND k = ? AND claim_token = ? AND claim_through >= ?`, group, key, token, first)
	return err
}
