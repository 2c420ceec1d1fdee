package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
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

// RescueDue implements ferrydriver.Inbox: an expired claim on a key with
// no row under a live claim (of the first rescueDueScan expired ones).
func (d *Driver) RescueDue(ctx context.Context, group string) (bool, error) {
	now := time.Now().UTC()
	fail := func(err error) (bool, error) {
		return false, fmt.Errorf("ferrymongo: look for expired claims in group %s: %w", group, err)
	}
	cur, err := d.inbox().Find(ctx, expiredClaims(group, now), options.Find().SetProjection(bson.D{{Key: "key", Value: 1}}).SetLimit(rescueDueScan))
	if err != nil {
		return fail(err)
	}
	var docs []struct {
		Key string `bson:"key"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return fail(err)
	}
	seen := map[string]bool{}
	for _, doc := range docs {
		if seen[doc.Key] {
			continue
		}
		seen[doc.Key] = true
		live := append(liveClaims(group, now), bson.E{Key: "key", Value: doc.Key})
		err := d.inbox().FindOne(ctx, live, options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			return true, nil
		case err != nil:
			return fail(err)
		}
	}
	return false, nil
}

// rescueDueScan bounds the expired claims RescueDue looks at.
const rescueDueScan = 100
