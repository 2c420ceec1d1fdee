package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// commitBudget bounds how long AttemptTx retries a commit whose result is
// unknown, as the convenient transactions API does by default.
const commitBudget = 120 * time.Second

// AttemptTx implements txdriver.Transactor: one session transaction
// (snapshot reads, majority writes) around fn. An
// UnknownTransactionCommitResult retries the commit only (the driver
// applies w:majority to the retry), never the callback, until it succeeds,
// fails otherwise, is MaxTimeMSExpired, or the budget is spent; then it is
// a CommitUnknownError for RunTx to resolve through the request record.
func (d *Driver) AttemptTx(ctx context.Context, fn func(ctx context.Context, tx context.Context) error) error {
	tx, sess, end, err := d.startTx(ctx)
	if err != nil {
		return err
	}
	defer end()
	if err := fn(tx, tx); err != nil {
		_ = sess.AbortTransaction(context.WithoutCancel(tx))
		return err
	}
	deadline := time.Now().Add(commitBudget)
	for attempt := 1; ; attempt++ {
		err := sess.CommitTransaction(tx)
		if err == nil {
			return nil
		}
		switch decideTxError(err, true, deadline, time.Now()) {
		case txRetryCommit:
			d.cfg.Logger.Info("ferrymongo: commit result unknown; committing again", "attempt", attempt, "err", err)
			select {
			case <-ctx.Done():
				return &txdriver.CommitUnknownError{Err: err}
			case <-time.After(min(time.Duration(attempt)*10*time.Millisecond, 500*time.Millisecond)):
			}
			continue
		case txRerun:
			return err // labelled TransientTransactionError: RunTx reruns the callback
		}
		if hasLabel(err, labelUnknownCommit) {
			return &txdriver.CommitUnknownError{Err: err}
		}
		return err
	}
}

// ClassifyTxError implements txdriver.Transactor.
func (d *Driver) ClassifyTxError(err error) txdriver.ErrorInfo {
	var cu *txdriver.CommitUnknownError
	switch {
	case errors.As(err, &cu):
		return txdriver.ErrorInfo{Class: txdriver.CommitUnknown, Cause: "UnknownTransactionCommitResult"}
	case hasLabel(err, labelTransient):
		info := txdriver.ErrorInfo{Class: txdriver.Retry, Cause: labelTransient}
		if hasCode(err, codeWriteConflict) {
			info.Cause = "WriteConflict"
		}
		return info
	}
	return txdriver.ErrorInfo{Class: txdriver.Permanent}
}

// ResolveCommit implements txdriver.Transactor: MongoDB offers no way
// to ask whether a given transaction committed, so the request record is
// the only witness.
func (d *Driver) ResolveCommit(context.Context, *txdriver.CommitUnknownError) (txdriver.Outcome, error) {
	return txdriver.OutcomeUnknown, nil
}

func (d *Driver) requests() *mongo.Collection {
	return d.db.Collection(d.cfg.Prefix+"requests", options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadConcern(readconcern.Majority()))
}

type requestDoc struct {
	ID          string    `bson:"_id"`
	Fingerprint string    `bson:"fingerprint"`
	Result      []byte    `bson:"result,omitempty"`
	CreatedAt   time.Time `bson:"created_at"`
}

// ClaimRequestTx implements txdriver.Transactor: the insert of the
// request's _id conflicts with a concurrent claim (WriteConflict: RunTx
// reruns) or fails on a committed one (duplicate key: ErrRequestExists).
func (d *Driver) ClaimRequestTx(ctx context.Context, tx context.Context, p *txdriver.ClaimRequestParams) error {
	_, err := d.requests().InsertOne(tx, &requestDoc{ID: p.ID, Fingerprint: p.Fingerprint, CreatedAt: time.Now().UTC()})
	if mongo.IsDuplicateKeyError(err) {
		return fmt.Errorf("ferrymongo: request %s: %w", p.ID, txdriver.ErrRequestExists)
	}
	if err != nil {
		return fmt.Errorf("ferrymongo: record request %s: %w", p.ID, err)
	}
	return nil
}

// FinishRequestTx implements txdriver.Transactor.
func (d *Driver) FinishRequestTx(ctx context.Context, tx context.Context, p *txdriver.FinishRequestParams) error {
	_, err := d.requests().UpdateOne(tx, bson.D{{Key: "_id", Value: p.ID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "result", Value: p.Result}}}})
	if err != nil {
		return fmt.Errorf("ferrymongo: store the result of request %s: %w", p.ID, err)
	}
	return nil
}

// GetRequest implements txdriver.Transactor, reading with majority
// read concern outside any session.
func (d *Driver) GetRequest(ctx context.Context, id string) (*txdriver.RequestRecord, error) {
	var doc requestDoc
	err := d.requests().FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("ferrymongo: request %s: %w", id, ferrydriver.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("ferrymongo: read request %s: %w", id, err)
	}
	return &txdriver.RequestRecord{ID: doc.ID, Fingerprint: doc.Fingerprint, Result: doc.Result, CreatedAt: doc.CreatedAt}, nil
}

// DeleteRequests implements txdriver.Transactor.
func (d *Driver) DeleteRequests(ctx context.Context, p *txdriver.DeleteRequestsParams) (int64, error) {
	limit := int64(p.Limit)
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	n, err := deleteOldest(ctx, d.requests(), bson.D{{Key: "created_at", Value: bson.D{{Key: "$lt", Value: time.Now().Add(-p.OlderThan)}}}},
		bson.D{{Key: "created_at", Value: 1}}, limit)
	if err != nil {
		return 0, fmt.Errorf("ferrymongo: delete old request records: %w", err)
	}
	return n, nil
}

var _ txdriver.Transactor[context.Context] = (*Driver)(nil)
