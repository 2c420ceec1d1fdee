package ferrymongo

import (
	"context"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// expiredClaims selects a group's rows whose claim has expired.
func expiredClaims(group string, now time.Time) bson.D {
	return bson.D{{Key: "g", Value: group}, {Key: "state", Value: string(ferrydriver.InboxProcessing)},
		{Key: "claim_expires_at", Value: bson.D{{Key: "$lte", Value: now}}}}
}

// liveClaims selects the group's unexpired claims (the g,
// claim_expires_at index).
func liveClaims(group string, now time.Time) bson.D {
	return bson.D{{Key: "g", Value: group}, {Key: "claim_expires_at", Value: bson.D{{Key: "$gt", Value: now}}},
		{Key: "state", Value: string(ferrydriver.InboxProcessing)}}
}

// MaxConns implements ferrydriver.Inbox: 0, as the MongoDB driver's pool
// (maxPoolSize, 100 by default) is shared by the client's sessions and
// waits for a connection instead of failing.
func (d *Driver) MaxConns() int { return 0 }

// ClaimHolders implements ferrydriver.Inbox.
func (d *Driver) ClaimHolders(ctx context.Context, group string) ([]string, error) {
	var out []string
	if err := d.inbox().Distinct(ctx, "claimed_by", liveClaims(group, time.Now().UTC())).Decode(&out); err != nil {
		return nil, fmt.Errorf("ferrymongo: list the claim holders of group %s: %w", group, err)
	}
	return out, nil
}

// ExpireClaims implements ferrydriver.Inbox: the documents it ends
// are expired claims, which a rescue takes (and every finish refuses).
func (d *Driver) ExpireClaims(ctx context.Context, p *ferrydriver.ExpireClaimsParams) (int, error) {
	group, worker := p.Group, p.Worker
	now := time.Now().UTC()
	filter := append(liveClaims(group, now), bson.E{Key: "claimed_by", Value: worker})
	res, err := d.inbox().UpdateMany(ctx, filter, bson.D{{Key: "$set", Value: bson.D{{Key: "claim_expires_at", Value: now}}}})
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: expire the claims of %s in group %s: %w", worker, group, err)
	}
	return int(res.ModifiedCount), nil
}

// RescueDue implements ferrydriver.Inbox: a rescue would take a key's
// head (inboxmodel.Decide) of one of the keys with a row under an expired
// claim. A head that a rescue took and that failed (its retry later, or
// DEAD holding the key) leaves the rest of its run under the expired
// claim, and no rescue due until it may run again.
func (d *Driver) RescueDue(ctx context.Context, group string) (bool, error) {
	now := time.Now().UTC()
	fail := func(err error) (bool, error) {
		return false, fmt.Errorf("ferrymongo: look for expired claims in group %s: %w", group, err)
	}
	var keys []string
	if err := d.inbox().Distinct(ctx, "key", expiredClaims(group, now)).Decode(&keys); err != nil {
		return fail(err)
	}
	for _, k := range keys {
		h, err := d.keyHead(ctx, group, k, now)
		if err != nil {
			return fail(err)
		}
		if inboxmodel.Decide(h.view(), now, true) == inboxmodel.Take {
			return true, nil
		}
	}
	return false, nil
}
