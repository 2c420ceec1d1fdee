package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Claims live on the key's document, as ferrypg's and ferrysqlite's do on
// the key's row: a claim takes a run of a key's next rows in order, with
// one token and one expiry, and stores the range of positions it covers
// (claim_from < pos <= claim_through); the rows are not written until
// their outcomes are known, and a PENDING or FAILED row inside its key's
// claim reads as PROCESSING, its attempt counted. A finish records its
// row's outcome and then ends the claim, or keeps it on the rest of the
// run (CompleteInboxParams.Keep). A claim that expired is rescued: every
// row it covered counts the attempt, and they run one at a time
// (suspect_through), each under a claim of its own. What to do with a key
// is inboxmodel's (ClaimKey, RescueKey, NextUnclaimed); every change
// writes the key's document, so that two transactions changing one key
// conflict.

// keyDoc is a key's document in <prefix>inbox_keys.
type keyDoc struct {
	Group          string     `bson:"g"`
	Key            string     `bson:"k"`
	RunnableAt     *time.Time `bson:"runnable_at"`
	HeldBy         *string    `bson:"held_by"`
	ClaimToken     *string    `bson:"claim_token"`
	ClaimedBy      string     `bson:"claimed_by,omitempty"`
	ClaimFrom      int64      `bson:"claim_from,omitempty"`
	ClaimThrough   int64      `bson:"claim_through,omitempty"`
	ClaimExpiresAt *time.Time `bson:"claim_expires_at"`
	SuspectThrough int64      `bson:"suspect_through,omitempty"`
	RescueAt       *time.Time `bson:"rescue_at"`
}

// covers says whether the key's claim covers position pos.
func (k *keyDoc) covers(pos int64) bool {
	return k.ClaimToken != nil && pos > k.ClaimFrom && pos <= k.ClaimThrough
}

// bump is the update operator every write of a key's document carries, so
// that two transactions touching one key always conflict.
var bump = bson.E{Key: "$inc", Value: bson.D{{Key: "v", Value: int64(1)}}}

// noClaim is the $set of a key's document whose claim ended.
func noClaim(suspects int64) bson.D {
	return bson.D{{Key: "claim_token", Value: nil}, {Key: "claimed_by", Value: ""}, {Key: "claim_from", Value: int64(0)},
		{Key: "claim_through", Value: int64(0)}, {Key: "claim_expires_at", Value: nil}, {Key: "rescue_at", Value: nil},
		{Key: "suspect_through", Value: suspects}}
}

// readKey reads a key's document in tx (nil: none).
func (d *Driver) readKey(tx context.Context, group, key string) (*keyDoc, error) {
	var k keyDoc
	err := d.inboxKeys().FindOne(tx, bson.D{{Key: "_id", Value: keyID(group, key)}}).Decode(&k)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &k, nil
}

// queue reads a key's first n unfinished rows in tx, in order, passing
// DEAD rows unless the policy holds (hold).
func (d *Driver) queue(tx context.Context, group, key string, hold bool, n int) ([]inboxmodel.Queued, []inboxID, error) {
	cur, err := d.inbox().Find(tx, bson.D{{Key: "g", Value: group}, {Key: "key", Value: key}, {Key: "state", Value: bson.D{{Key: "$in", Value: unfinishedUnder(hold)}}}},
		options.Find().SetSort(bson.D{{Key: "pos", Value: 1}}).SetLimit(int64(n)).
			SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: "state", Value: 1}, {Key: "pos", Value: 1}, {Key: "attempts", Value: 1}, {Key: "next_attempt_at", Value: 1}}))
	if err != nil {
		return nil, nil, err
	}
	var docs []inboxDoc
	if err := cur.All(tx, &docs); err != nil {
		return nil, nil, err
	}
	q, ids := make([]inboxmodel.Queued, len(docs)), make([]inboxID, len(docs))
	for i, doc := range docs {
		q[i] = inboxmodel.Queued{State: ferrydriver.InboxState(doc.State), Pos: doc.Pos, Attempts: doc.Attempts, RetryAt: doc.NextAttemptAt}
		ids[i] = doc.ID
	}
	return q, ids, nil
}

// refreshKey recomputes, in tx, when a key may run, after its queue
// changed. A claimed key keeps its claim (its finish, or the rescue of its
// expiry, recomputes it), and its document is written all the same, so
// that the change conflicts with a finish reading the queue concurrently.
// Any other key is left as inboxmodel.NextUnclaimed says.
func (d *Driver) refreshKey(tx context.Context, group, key string, now time.Time) error {
	k, err := d.readKey(tx, group, key)
	if err != nil {
		return err
	}
	if k != nil && k.ClaimToken != nil {
		_, err := d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(group, key)}}, bson.D{bump})
		return err
	}
	hold, err := d.policy(tx, group)
	if err != nil {
		return err
	}
	head, ids, err := d.queue(tx, group, key, hold, 1)
	if err != nil {
		return err
	}
	var suspects int64
	if k != nil {
		suspects = k.SuspectThrough
	}
	var runnable, rescue, heldBy any
	switch at, rescueAt, held := inboxmodel.NextUnclaimed(head, suspects, now); {
	case held:
		heldBy = ids[0].Event
	case !rescueAt.IsZero():
		rescue = rescueAt
	case !at.IsZero():
		runnable = at
	}
	_, err = d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(group, key)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "g", Value: group}, {Key: "k", Value: key}, {Key: "runnable_at", Value: runnable},
			{Key: "rescue_at", Value: rescue}, {Key: "held_by", Value: heldBy}}}, bump},
		options.UpdateOne().SetUpsert(true))
	return err
}

// ClaimInbox implements ferrydriver.Inbox: for each due key (an ordinary
// claim: runnable_at has come; a rescue: rescue_at has), one short
// transaction reads the key again and claims it. A key another worker
// changed meanwhile conflicts and is skipped.
func (d *Driver) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	now := time.Now().UTC()
	due := "runnable_at"
	if p.Rescue {
		due = "rescue_at"
	}
	limit := int64(inboxmodel.ClaimLimit(inboxmodel.ClaimParams{Limit: p.Limit, Keys: p.Keys}))
	cur, err := d.inboxKeys().Find(ctx, bson.D{{Key: "g", Value: p.Group}, {Key: due, Value: bson.D{{Key: "$lte", Value: now}}}},
		options.Find().SetSort(bson.D{{Key: due, Value: 1}}).SetLimit(limit).SetProjection(bson.D{{Key: "k", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: claim inbox rows of group %s: %w", p.Group, err)
	}
	var keys []struct {
		K string `bson:"k"`
	}
	if err := cur.All(ctx, &keys); err != nil {
		return nil, fmt.Errorf("ferrymongo: claim inbox rows of group %s: %w", p.Group, err)
	}
	var out []*ferrydriver.InboxRow
	for _, k := range keys {
		if len(out) >= max(p.Limit, 1) {
			break
		}
		rows, err := d.claimKey(ctx, p, k.K, max(p.Limit, 1)-len(out))
		if err != nil {
			if hasLabel(err, labelTransient) || hasCode(err, codeWriteConflict) {
				continue // another worker changed the key first
			}
			return out, fmt.Errorf("ferrymongo: claim key %s of group %s: %w", k.K, p.Group, err)
		}
		out = append(out, rows...)
	}
	return out, nil
}

// claimKey claims of one key what claimKeyTx says, at most room rows, in
// a transaction of its own, without WithTransaction's retries: a conflict
// means someone else has it.
func (d *Driver) claimKey(ctx context.Context, p *ferrydriver.ClaimInboxParams, key string, room int) ([]*ferrydriver.InboxRow, error) {
	tx, sess, end, err := d.startTx(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	rows, err := d.claimKeyTx(tx, p, key, room)
	if err != nil {
		_ = sess.AbortTransaction(context.WithoutCancel(tx))
		return nil, err
	}
	if err := sess.CommitTransaction(tx); err != nil {
		return nil, err
	}
	return rows, nil
}

// claimKeyTx claims, in tx, a key that is still due: an ordinary claim
// its head and, after a PENDING head, a run of its next rows, up to
// p.PerKey and room (inboxmodel.ClaimKey); a rescue, the head alone while
// it is suspect (inboxmodel.RescueKey), after charging every row of the
// expired claim its attempt. A head whose attempts are spent goes DEAD
// instead; a key with nothing to run now is recomputed.
func (d *Driver) claimKeyTx(tx context.Context, p *ferrydriver.ClaimInboxParams, key string, room int) ([]*ferrydriver.InboxRow, error) {
	now := time.Now().UTC()
	k, err := d.readKey(tx, p.Group, key)
	if err != nil || k == nil {
		return nil, err
	}
	hold, err := d.policy(tx, p.Group)
	if err != nil {
		return nil, err
	}
	if !p.Rescue {
		if k.ClaimToken != nil || k.RunnableAt == nil || k.RunnableAt.After(now) {
			return nil, nil // claimed or changed since it was listed
		}
		n := 1
		if p.PerKey > 1 {
			n = min(p.PerKey, room)
		}
		q, ids, err := d.queue(tx, p.Group, key, hold, n)
		if err != nil {
			return nil, err
		}
		act, run := inboxmodel.ClaimKey(q, k.SuspectThrough, hold, n, now, p.MaxAttempts)
		switch act {
		case inboxmodel.Recompute:
			return nil, d.refreshKey(tx, p.Group, key, now)
		case inboxmodel.GiveUp:
			return d.kill(tx, p.Group, key, ids[0], now)
		}
		return d.claimRows(tx, p, key, uuid.NewString(), q[0].Pos, q[run[len(run)-1]].Pos, k.SuspectThrough, now)
	}
	if k.RescueAt == nil || k.RescueAt.After(now) {
		return nil, nil // changed since it was listed
	}
	suspects := k.SuspectThrough
	if k.ClaimToken != nil {
		// Its rows count the attempt the expired claim was making.
		if _, err := d.inbox().UpdateMany(tx, bson.D{{Key: "g", Value: p.Group}, {Key: "key", Value: key},
			{Key: "pos", Value: bson.D{{Key: "$gt", Value: k.ClaimFrom}, {Key: "$lte", Value: k.ClaimThrough}}},
			{Key: "state", Value: bson.D{{Key: "$in", Value: claimableStates}}}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}}}); err != nil {
			return nil, err
		}
		suspects = max(suspects, k.ClaimThrough)
	}
	q, ids, err := d.queue(tx, p.Group, key, hold, 1)
	if err != nil {
		return nil, err
	}
	act, suspects := inboxmodel.RescueKey(q, suspects, now, p.MaxAttempts)
	if act == inboxmodel.ClaimRows {
		return d.claimRows(tx, p, key, uuid.NewString(), q[0].Pos, q[0].Pos, suspects, now)
	}
	if err := d.endClaim(tx, p.Group, key, suspects); err != nil {
		return nil, err
	}
	if act == inboxmodel.GiveUp {
		return d.kill(tx, p.Group, key, ids[0], now)
	}
	// Nothing suspect runs now (the head waits for its retry, is held, or
	// is not suspect): the key is recomputed.
	return nil, d.refreshKey(tx, p.Group, key, now)
}

// claimRows claims, in tx, key's unfinished rows from position first
// through last for p.Worker under token, and returns them PROCESSING,
// their attempt counted. suspects is the key's suspect_through (a
// rescue's: the rows after last still to run alone).
func (d *Driver) claimRows(tx context.Context, p *ferrydriver.ClaimInboxParams, key, token string, first, last, suspects int64, now time.Time) ([]*ferrydriver.InboxRow, error) {
	expires := now.Add(p.TTL)
	if _, err := d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(p.Group, key)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "claim_token", Value: token}, {Key: "claimed_by", Value: p.Worker}, {Key: "claim_from", Value: first - 1},
			{Key: "claim_through", Value: last}, {Key: "claim_expires_at", Value: expires}, {Key: "rescue_at", Value: expires},
			{Key: "runnable_at", Value: nil}, {Key: "held_by", Value: nil}, {Key: "suspect_through", Value: suspects}}}, bump}); err != nil {
		return nil, err
	}
	cur, err := d.inbox().Find(tx, bson.D{{Key: "g", Value: p.Group}, {Key: "key", Value: key},
		{Key: "state", Value: bson.D{{Key: "$in", Value: claimableStates}}},
		{Key: "pos", Value: bson.D{{Key: "$gte", Value: first}, {Key: "$lte", Value: last}}}}, options.Find().SetSort(bson.D{{Key: "pos", Value: 1}}))
	if err != nil {
		return nil, err
	}
	var docs []inboxDoc
	if err := cur.All(tx, &docs); err != nil {
		return nil, err
	}
	out := make([]*ferrydriver.InboxRow, len(docs))
	for i, doc := range docs {
		if out[i], err = doc.row(); err != nil {
			return nil, err
		}
		out[i].State, out[i].Attempts, out[i].Claim = ferrydriver.InboxProcessing, out[i].Attempts+1, token
	}
	return out, nil
}

// kill makes key's row id DEAD in tx, its attempts spent, and recomputes
// the key (held, or past the row, by the group's policy).
func (d *Driver) kill(tx context.Context, group, key string, id inboxID, now time.Time) ([]*ferrydriver.InboxRow, error) {
	var doc inboxDoc
	err := d.inbox().FindOne(tx, bson.D{{Key: "_id", Value: id}}).Decode(&doc)
	if err != nil {
		return nil, err
	}
	reason := ferrydriver.ReasonAttemptsExhausted
	if doc.LastError != "" {
		reason += " (last recorded error: " + doc.LastError + ")"
	}
	err = d.inbox().FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: string(ferrydriver.InboxDead)}, {Key: "last_error", Value: reason},
			{Key: "finished_at", Value: now}}}, pushAttempt(doc.Attempts, ferrydriver.InboxDead, ferrydriver.ReasonAttemptsExhausted, now)},
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&doc)
	if err != nil {
		return nil, err
	}
	if err := d.refreshKey(tx, group, key, now); err != nil {
		return nil, err
	}
	row, err := doc.row()
	if err != nil {
		return nil, err
	}
	return []*ferrydriver.InboxRow{row}, nil
}

// endClaim ends key's claim in tx, if any, and stores how far its rows
// are suspect.
func (d *Driver) endClaim(tx context.Context, group, key string, suspects int64) error {
	_, err := d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(group, key)}}, bson.D{{Key: "$set", Value: noClaim(suspects)}, bump})
	return err
}

// finish records, in tx, a claimed row's outcome, under its key's
// unexpired claim (ErrClaimLost otherwise), and then ends the claim,
// giving the rest of its run back (they run again under a later claim,
// uncounted), or, with keep, keeps it on the rest, if any is left.
func (d *Driver) finish(tx context.Context, group string, id uuid.UUID, claim string, state ferrydriver.InboxState, lastErr string, retry *time.Time, uncounted, keep bool) error {
	lost := func() error {
		return fmt.Errorf("ferrymongo: mark event %s %s for group %s: %w", id, state, group, ferrydriver.ErrClaimLost)
	}
	if claim == "" {
		return lost()
	}
	now := time.Now().UTC()
	var doc inboxDoc
	err := d.inbox().FindOne(tx, bson.D{{Key: "_id", Value: rowID(group, id)}},
		options.FindOne().SetProjection(bson.D{{Key: "key", Value: 1}, {Key: "pos", Value: 1}, {Key: "state", Value: 1}, {Key: "attempts", Value: 1}})).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return lost()
	}
	if err != nil {
		return fmt.Errorf("ferrymongo: mark inbox row %s: %w", state, err)
	}
	k, err := d.readKey(tx, group, doc.Key)
	if err != nil {
		return fmt.Errorf("ferrymongo: mark inbox row %s: %w", state, err)
	}
	if k == nil || k.ClaimToken == nil || *k.ClaimToken != claim || k.ClaimExpiresAt == nil || !k.ClaimExpiresAt.After(now) || !k.covers(doc.Pos) ||
		(doc.State != string(ferrydriver.InboxPending) && doc.State != string(ferrydriver.InboxFailed)) {
		return lost()
	}
	set := bson.D{{Key: "state", Value: string(state)}}
	if state != ferrydriver.InboxProcessed {
		set = append(set, bson.E{Key: "last_error", Value: lastErr})
	}
	if retry != nil {
		set = append(set, bson.E{Key: "next_attempt_at", Value: *retry})
	}
	if state == ferrydriver.InboxProcessed || state == ferrydriver.InboxDead {
		set = append(set, bson.E{Key: "finished_at", Value: now})
	}
	update := bson.D{{Key: "$set", Value: set}}
	if !uncounted {
		update = append(update, bson.E{Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}})
		if state == ferrydriver.InboxFailed || state == ferrydriver.InboxDead {
			update = append(update, pushAttempt(doc.Attempts+1, state, lastErr, now))
		}
	}
	if _, err := d.inbox().UpdateOne(tx, bson.D{{Key: "_id", Value: rowID(group, id)}}, update); err != nil {
		return fmt.Errorf("ferrymongo: mark inbox row %s: %w", state, err)
	}
	if keep && state == ferrydriver.InboxProcessed {
		left, err := d.inbox().CountDocuments(tx, bson.D{{Key: "g", Value: group}, {Key: "key", Value: doc.Key},
			{Key: "pos", Value: bson.D{{Key: "$gt", Value: doc.Pos}, {Key: "$lte", Value: k.ClaimThrough}}},
			{Key: "state", Value: bson.D{{Key: "$in", Value: claimableStates}}}},
			options.Count().SetLimit(1))
		if err != nil {
			return fmt.Errorf("ferrymongo: keep the claim of inbox key %s: %w", doc.Key, err)
		}
		if left > 0 {
			_, err := d.inboxKeys().UpdateOne(tx, bson.D{{Key: "_id", Value: keyID(group, doc.Key)}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "claim_from", Value: doc.Pos}}}, bump})
			return err
		}
	}
	if err := d.endClaim(tx, group, doc.Key, k.SuspectThrough); err != nil {
		return fmt.Errorf("ferrymongo: end the claim of inbox key %s: %w", doc.Key, err)
	}
	if err := d.refreshKey(tx, group, doc.Key, now); err != nil {
		return fmt.Errorf("ferrymongo: refresh inbox key %s: %w", doc.Key, err)
	}
	return nil
}

// claimedRows returns docs as rows, those inside their key's claim
// PROCESSING, their attempt counted: it reads the documents of the keys of
// the PENDING and FAILED ones.
func (d *Driver) claimedRows(ctx context.Context, group string, docs []inboxDoc) ([]*ferrydriver.InboxRow, error) {
	var keys bson.A
	seen := map[string]bool{}
	for _, doc := range docs {
		if (doc.State == string(ferrydriver.InboxPending) || doc.State == string(ferrydriver.InboxFailed)) && !seen[doc.Key] {
			seen[doc.Key] = true
			keys = append(keys, keyID(group, doc.Key))
		}
	}
	claims := map[string]*keyDoc{}
	if len(keys) > 0 {
		cur, err := d.inboxKeys().Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: keys}}}, {Key: "claim_token", Value: bson.D{{Key: "$ne", Value: nil}}}})
		if err != nil {
			return nil, err
		}
		var ks []keyDoc
		if err := cur.All(ctx, &ks); err != nil {
			return nil, err
		}
		for i := range ks {
			claims[ks[i].Key] = &ks[i]
		}
	}
	out := make([]*ferrydriver.InboxRow, len(docs))
	for i, doc := range docs {
		row, err := doc.row()
		if err != nil {
			return nil, err
		}
		if k := claims[doc.Key]; k != nil && k.covers(doc.Pos) && (row.State == ferrydriver.InboxPending || row.State == ferrydriver.InboxFailed) {
			row.State, row.Attempts = ferrydriver.InboxProcessing, row.Attempts+1
		}
		out[i] = row
	}
	return out, nil
}
