package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// RetractInbox implements ferrydriver.Inbox in one transaction:
// the group's rows are retracted (a running row's worker finds its claim
// gone), events it never received are recorded as retracted, the
// compensations of processed ones are queued at the end of their keys,
// and the keys' heads recomputed (which also makes concurrent key writers
// conflict and retry).
func (d *Driver) RetractInbox(ctx context.Context, p *ferrydriver.RetractInboxParams) ([]ferrydriver.InboxState, error) {
	res := make([]ferrydriver.InboxState, len(p.Retractions))
	if len(p.Retractions) == 0 {
		return res, nil
	}
	err := d.inTx(ctx, func(tx context.Context) error {
		clear(res)
		now := time.Now().UTC()
		keys := map[string]bool{}
		retract := func(ev *ferryevent.Event) (ferrydriver.InboxState, bool, error) {
			var doc inboxDoc
			err := d.inbox().FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: rowID(p.Group, ev.ID)}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: string(ferrydriver.InboxRetracted)}, {Key: "finished_at", Value: now}}},
					{Key: "$unset", Value: bson.D{{Key: "claimed_by", Value: ""}, {Key: "claim_expires_at", Value: ""}}}}).Decode(&doc)
			if errors.Is(err, mongo.ErrNoDocuments) {
				return "", false, nil
			}
			if err != nil {
				return "", false, err
			}
			keys[doc.Key] = true
			return ferrydriver.InboxState(doc.State), true, nil
		}
		var compensations []*ferryevent.Event
		for i, r := range p.Retractions {
			prior, found, err := retract(r.Event)
			if err != nil {
				return err
			}
			res[i] = prior
			if !found {
				if err := d.insertInboxTx(tx, p.Group, []*ferryevent.Event{r.Event}, make([]bool, 1)); err != nil {
					return err
				}
				if _, _, err := retract(r.Event); err != nil {
					return err
				}
			}
			if prior == ferrydriver.InboxProcessed && r.Compensation != nil {
				compensations = append(compensations, r.Compensation)
				keys[r.Compensation.Key] = true
			}
		}
		if len(compensations) > 0 {
			if err := d.insertInboxTx(tx, p.Group, compensations, make([]bool, len(compensations))); err != nil {
				return err
			}
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		slices.Sort(sorted)
		for _, k := range sorted {
			if err := d.refreshKey(tx, p.Group, k, now); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: retract inbox rows of group %s: %w", p.Group, err)
	}
	return res, nil
}
