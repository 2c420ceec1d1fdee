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
	"go.mongodb.org/mongo-driver/v2/mongo/options"
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
		// cuts: of each key whose claim covered a retracted row, the first
		// such row's position.
		cuts := map[string]int64{}
		retract := func(ev *ferryevent.Event) (ferrydriver.InboxState, bool, error) {
			var doc inboxDoc
			err := d.inbox().FindOne(tx, bson.D{{Key: "_id", Value: rowID(p.Group, ev.ID)}},
				options.FindOne().SetProjection(bson.D{{Key: "key", Value: 1}, {Key: "pos", Value: 1}, {Key: "state", Value: 1}})).Decode(&doc)
			if errors.Is(err, mongo.ErrNoDocuments) {
				return "", false, nil
			}
			if err != nil {
				return "", false, err
			}
			keys[doc.Key] = true
			prior := ferrydriver.InboxState(doc.State)
			if prior == ferrydriver.InboxRetracted {
				return prior, true, nil
			}
			set := bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: string(ferrydriver.InboxRetracted)}, {Key: "finished_at", Value: now}}}}
			if prior == ferrydriver.InboxPending || prior == ferrydriver.InboxFailed {
				k, err := d.readKey(tx, p.Group, doc.Key)
				if err != nil {
					return "", false, err
				}
				if k != nil && k.covers(doc.Pos) {
					// It keeps the claim's attempt, which only its finish
					// or a rescue would have stored: InboxRow.Attempts
					// counts the row's claims.
					prior = ferrydriver.InboxProcessing
					set = append(set, bson.E{Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}})
					if c, ok := cuts[doc.Key]; !ok || doc.Pos < c {
						cuts[doc.Key] = doc.Pos
					}
				}
			}
			if _, err := d.inbox().UpdateOne(tx, bson.D{{Key: "_id", Value: doc.ID}}, set); err != nil {
				return "", false, err
			}
			return prior, true, nil
		}
		var compensations []*ferryevent.Event
		for i, r := range p.Retractions {
			prior, found, err := retract(r.Event)
			if err != nil {
				return err
			}
			res[i] = prior
			if !found {
				if _, err := d.insertInboxTx(tx, p.Group, []*ferryevent.Event{r.Event}, make([]bool, 1)); err != nil {
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
			if _, err := d.insertInboxTx(tx, p.Group, compensations, make([]bool, len(compensations))); err != nil {
				return err
			}
		}
		for k, first := range cuts {
			if err := d.cutClaim(tx, p.Group, k, first); err != nil {
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

// cutClaim cuts key's claim short in tx, to end just before its retracted
// row at position first: the worker running that row finds its claim lost
// there, and the rows before stay its own (no other worker claims them
// while it may be running them). A claim with nothing left to run (every
// row of it finished or retracted) ends instead; one cut to nothing with
// rows after the cut (a batch may be running them) stays the worker's
// until it expires.
func (d *Driver) cutClaim(tx context.Context, group, key string, first int64) error {
	k, err := d.readKey(tx, group, key)
	if err != nil || k == nil || !k.covers(first) {
		return err
	}
	live, err := d.inbox().CountDocuments(tx, bson.D{{Key: "g", Value: group}, {Key: "key", Value: key},
		{Key: "pos", Value: bson.D{{Key: "$gt", Value: k.ClaimFrom}, {Key: "$lte", Value: k.ClaimThrough}}},
		{Key: "state", Value: bson.D{{Key: "$in", Value: claimableStates}}}},
		options.Count().SetLimit(1))
	if err != nil {
		return err
	}
	if live == 0 {
		return d.endClaim(tx, group, key, k.SuspectThrough)
	}
	_, err = d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(group, key)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "claim_through", Value: first - 1}}}, bump})
	return err
}
