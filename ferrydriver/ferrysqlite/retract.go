package ferrysqlite

import (
	"context"
	"database/sql"
	"errors"
	"slices"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// RetractInbox implements ferrydriver.Inbox, in one write
// transaction: the group's rows are retracted, events it never received
// are recorded as retracted, compensations of processed ones are queued,
// and the keys' heads recomputed.
func (d *Driver) RetractInbox(ctx context.Context, p *ferrydriver.RetractInboxParams) ([]ferrydriver.InboxState, error) {
	res := make([]ferrydriver.InboxState, len(p.Retractions))
	if len(p.Retractions) == 0 {
		return res, nil
	}
	op := "retract inbox rows of group " + p.Group
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		t := micros(now())
		keys := map[string]bool{}
		// cuts: of each key whose claim covered a retracted row, the first
		// such row's position.
		cuts := map[string]int64{}
		retract := func(r ferrydriver.Retraction) (ferrydriver.InboxState, bool, error) {
			var prior, key string
			var pos int64
			var claimed bool
			err := tx.QueryRowContext(ctx, `SELECT i.state, i.key, i.pos, `+inClaim+` FROM ferry_inbox i WHERE i.group_name = ? AND i.event_id = ?`,
				p.Group, r.Event.ID.String()).Scan(&prior, &key, &pos, &claimed)
			if errors.Is(err, sql.ErrNoRows) {
				return "", false, nil
			}
			if err != nil {
				return "", false, d.wrapErr(op, err)
			}
			keys[key] = true
			if claimed {
				// It keeps the claim's attempt, which only its finish or a
				// rescue would have stored: InboxRow.Attempts counts the
				// row's claims.
				prior = string(ferrydriver.InboxProcessing)
				if c, ok := cuts[key]; !ok || pos < c {
					cuts[key] = pos
				}
			}
			if prior != string(ferrydriver.InboxRetracted) {
				if _, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox SET state = 'retracted', finished_at = ?, attempts = attempts + ?
 WHERE group_name = ? AND event_id = ?`, t, claimed, p.Group, r.Event.ID.String()); err != nil {
					return "", false, d.wrapErr(op, err)
				}
				// Delivered to awaiting callers when the transaction commits.
				d.events.note(settledNote{group: p.Group, id: r.Event.ID, state: ferrydriver.InboxRetracted})
			}
			return ferrydriver.InboxState(prior), true, nil
		}
		var compensations []*ferryevent.Event
		for i, r := range p.Retractions {
			prior, found, err := retract(r)
			if err != nil {
				return err
			}
			res[i] = prior
			if !found {
				// Never received: recorded, then retracted.
				if _, err := d.insertInboxTx(ctx, tx, p.Group, []*ferryevent.Event{r.Event}, make([]bool, 1), t); err != nil {
					return err
				}
				if _, _, err := retract(r); err != nil {
					return err
				}
			}
			if prior == ferrydriver.InboxProcessed && r.Compensation != nil {
				compensations = append(compensations, r.Compensation)
				keys[r.Compensation.Key] = true
			}
		}
		if len(compensations) > 0 {
			if _, err := d.insertInboxTx(ctx, tx, p.Group, compensations, make([]bool, len(compensations)), t); err != nil {
				return err
			}
		}
		for key, first := range cuts {
			if err := d.cutClaim(ctx, tx, p.Group, key, first); err != nil {
				return err
			}
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		slices.Sort(sorted)
		for _, key := range sorted {
			if err := d.refreshKey(ctx, tx, p.Group, key, t); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// cutClaim cuts key's claim short, to end just before its retracted row
// at position first: the worker running that row finds its claim lost
// there, and the rows before stay its own (no other worker claims them
// while it may be running them). A claim with nothing left to run (every
// row of it finished or retracted) ends instead; one cut to nothing with
// rows after the cut (a batch may be running them) stays the worker's
// until it expires.
func (d *Driver) cutClaim(ctx context.Context, tx *sql.Tx, group, key string, first int64) error {
	if _, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox_keys
   SET claim_through = ?1
 WHERE group_name = ?2 AND key = ?3 AND claim_token IS NOT NULL AND EXISTS (
       SELECT 1 FROM ferry_inbox i WHERE i.group_name = ?2 AND i.key = ?3 AND i.pos > claim_from AND i.pos <= claim_through
          AND i.`+unfinished+` AND i.state IN ('pending', 'failed'))`, first-1, group, key); err != nil {
		return d.wrapErr("cut the claim of inbox key "+key, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys SET `+noClaim+` WHERE group_name = ? AND key = ? AND claim_through >= ?`,
		group, key, first); err != nil {
		return d.wrapErr("cut the claim of inbox key "+key, err)
	}
	return nil
}
