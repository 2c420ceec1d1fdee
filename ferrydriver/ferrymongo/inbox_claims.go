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

// MaxConns implements ferrydriver.Inbox: 0, as the MongoDB driver's pool
// (maxPoolSize, 100 by default) is shared by the client's sessions and
// waits for a connection instead of failing.
func (d *Driver) MaxConns() int { return 0 }

// ClaimHolders implements ferrydriver.Inbox.
func (d *Driver) ClaimHolders(ctx context.Context, group string) ([]string, error) {
	var out []string
	if err := d.inboxKeys().Distinct(ctx, "claimed_by", liveClaims(group, time.Now().UTC())).Decode(&out); err != nil {
		return nil, fmt.Errorf("ferrymongo: list the claim holders of group %s: %w", group, err)
	}
	return out, nil
}

// liveClaims selects the group's keys under unexpired claims (the g,
// rescue_at index: a claim's rescue is due at its expiry).
func liveClaims(group string, now time.Time) bson.D {
	return bson.D{{Key: "g", Value: group}, {Key: "rescue_at", Value: bson.D{{Key: "$gt", Value: now}}},
		{Key: "claim_expires_at", Value: bson.D{{Key: "$gt", Value: now}}}}
}

// ExpireClaims implements ferrydriver.Inbox: the claims it ends are
// expired claims, which a rescue takes (and every finish refuses).
func (d *Driver) ExpireClaims(ctx context.Context, p *ferrydriver.ExpireClaimsParams) (int, error) {
	group, worker := p.Group, p.Worker
	now := time.Now().UTC()
	filter := append(liveClaims(group, now), bson.E{Key: "claimed_by", Value: worker})
	res, err := d.inboxKeys().UpdateMany(ctx, filter, bson.D{{Key: "$set", Value: bson.D{{Key: "claim_expires_at", Value: now}, {Key: "rescue_at", Value: now}}}, bump})
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: expire the claims of %s in group %s: %w", worker, group, err)
	}
	return int(res.ModifiedCount), nil
}

// RescueDue implements ferrydriver.Inbox: a key's claim expired, or its
// next suspect row may run.
func (d *Driver) RescueDue(ctx context.Context, group string) (bool, error) {
	err := d.inboxKeys().FindOne(ctx, bson.D{{Key: "g", Value: group}, {Key: "rescue_at", Value: bson.D{{Key: "$lte", Value: time.Now().UTC()}}}},
		options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("ferrymongo: look for expired claims in group %s: %w", group, err)
	}
	return true, nil
}
