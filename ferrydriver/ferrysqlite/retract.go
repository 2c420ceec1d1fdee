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
		retract := func(r ferrydriver.Retraction) (ferrydriver.InboxState, bool, error) {
			var prior, key string
			err := tx.QueryRowContext(ctx, `SELECT state, key FROM ferry_inbox WHERE group_name = ? AND event_id = ?`, p.Group, r.Event.ID.String()).Scan(&prior, &key)
			if errors.Is(err, sql.ErrNoRows) {
				return "", false, nil
			}
			if err != nil {
				return "", false, d.wrapErr(op, err)
			}
			keys[key] = true
			if prior != string(ferrydriver.InboxRetracted) {
				if _, err := tx.ExecContext(ctx, `
UPDATE ferry_inbox SET state = 'retracted', claimed_by = NULL, claim_expires_at = NULL, finished_at = ?
 WHERE group_name = ? AND event_id = ?`, t, p.Group, r.Event.ID.String()); err != nil {
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
				if err := d.insertInboxTx(ctx, tx, p.Group, []*ferryevent.Event{r.Event}, make([]bool, 1), t); err != nil {
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
			if err := d.insertInboxTx(ctx, tx, p.Group, compensations, make([]bool, len(compensations)), t); err != nil {
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
