package ferrymysql

import (
	"context"
	"database/sql"
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
	type found struct {
		state ferrydriver.InboxState
		key   string
		claim []byte // a PROCESSING row's claim token
	}
	prior := map[uuid.UUID]found{}
	err := chunks(ids, inListChunk, func(ids []uuid.UUID) error {
		rows, err := tx.QueryContext(ctx, `SELECT event_id, state, k, claim_token FROM ferry_inbox FORCE INDEX (ferry_inbox_event_idx) WHERE group_name = ? AND event_id IN (`+marks(len(ids))+`)
 ORDER BY event_id FOR UPDATE`, idArgs([]any{p.Group}, ids)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, k, claim []byte
			var st string
			if err := rows.Scan(&id, &st, &k, &claim); err != nil {
				return err
			}
			u, err := uuid.FromBytes(id)
			if err != nil {
				return err
			}
			prior[u] = found{state: ferrydriver.InboxState(st), key: string(k), claim: claim}
		}
		return rows.Err()
	})
	if err != nil {
		return d.wrapErr(op, err)
	}
	var ghosts, compensations []*ferryevent.Event
	var keys []string
	var retract []uuid.UUID
	type claimOf struct {
		key   string
		token uuid.UUID
	}
	var claims []claimOf // of the rows retracted while PROCESSING
	done := map[uuid.UUID]bool{}
	for i, r := range p.Retractions {
		f, ok := prior[r.Event.ID]
		res[i] = f.state
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
			if token, err := uuid.FromBytes(f.claim); f.state == ferrydriver.InboxProcessing && err == nil {
				claims = append(claims, claimOf{f.key, token})
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
			_, err := tx.ExecContext(ctx, `UPDATE ferry_inbox FORCE INDEX (ferry_inbox_event_idx) SET state = 'retracted', claimed_by = NULL, claim_token = NULL, claim_expires_at = NULL,
       finished_at = `+sqlNow+` WHERE group_name = ? AND event_id IN (`+marks(len(ids))+`)`, idArgs([]any{p.Group}, ids)...)
			return err
		})
		if err != nil {
			return d.wrapErr(op, err)
		}
	}
	// A row retracted while PROCESSING ends its claim: the rows of its
	// key's run that the claim still holds are given back, to run at once
	// rather than after the claim expires. Its worker stops at the first
	// row whose claim is gone (the one it runs, unless that one's finish
	// holds it already and commits).
	slices.SortFunc(claims, func(a, b claimOf) int { return strings.Compare(a.key, b.key) })
	for _, c := range slices.Compact(claims) {
		if err := giveBack(ctx, tx, runsRest(1, 1), p.Group, c.key, c.token[:]); err != nil {
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
	// The retracted rows' keys (their heads may have gone, or a worker's
	// row) and the compensations', in one pass in key order.
	return d.touchKeys(ctx, tx, p.Group, keys, true)
}
