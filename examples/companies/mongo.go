package companies

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymongo"
	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// MongoApp is the company service on MongoDB, as in the seed article: the
// same rules, with documents. Two requests for different companies still
// meet on the sequence document; MongoDB aborts the loser with a
// WriteConflict (TransientTransactionError) and RunTx reruns its whole
// callback.
type MongoApp struct {
	drv    *ferrymongo.Driver
	db     *mongo.Database
	client *ferry.Client[context.Context]
	log    *slog.Logger
}

// NewMongo returns the service on db, whose Ferry collections drv manages.
func NewMongo(drv *ferrymongo.Driver, db *mongo.Database, log *slog.Logger) (*MongoApp, error) {
	c, err := ferry.NewClient(drv, nil)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &MongoApp{drv: drv, db: db, client: c, log: log}, nil
}

// Migrate creates the unique indexes and the sequence document.
func (a *MongoApp) Migrate(ctx context.Context) error {
	for coll, keys := range map[string]bson.D{
		"companies":   {{Key: "canonical_key", Value: 1}},
		"memberships": {{Key: "company_id", Value: 1}, {Key: "member_id", Value: 1}},
	} {
		if _, err := a.db.Collection(coll).Indexes().CreateOne(ctx, mongo.IndexModel{Keys: keys, Options: options.Index().SetUnique(true)}); err != nil {
			return fmt.Errorf("companies: index on %s: %w", coll, err)
		}
	}
	_, err := a.db.Collection("sequences").UpdateOne(ctx, bson.D{{Key: "_id", Value: "company_display_number"}},
		bson.D{{Key: "$setOnInsert", Value: bson.D{{Key: "value", Value: int64(0)}}}}, options.UpdateOne().SetUpsert(true))
	return err
}

// LinkCompany is App.LinkCompany on MongoDB.
func (a *MongoApp) LinkCompany(ctx context.Context, requestID string, in LinkInput) (LinkResult, error) {
	key, err := CanonicalKey(in)
	if err != nil {
		return LinkResult{}, err
	}
	if in.MemberID == "" {
		return LinkResult{}, fmt.Errorf("%w: member_id is empty", ErrInvalidInput)
	}
	companies, memberships, sequences := a.db.Collection("companies"), a.db.Collection("memberships"), a.db.Collection("sequences")
	return ferry.RunTx(ctx, a.drv, &ferry.TxOptions{RequestID: requestID, Input: in, Logger: a.log},
		func(ctx context.Context, tx context.Context) (LinkResult, error) {
			var res LinkResult
			var company struct {
				ID     string `bson:"_id"`
				Number int64  `bson:"display_number"`
			}
			err := companies.FindOne(tx, bson.D{{Key: "canonical_key", Value: key}}).Decode(&company)
			switch {
			case errors.Is(err, mongo.ErrNoDocuments):
				var seq struct {
					Value int64 `bson:"value"`
				}
				// The shared document every new company writes.
				if err := sequences.FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: "company_display_number"}},
					bson.D{{Key: "$inc", Value: bson.D{{Key: "value", Value: int64(1)}}}},
					options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&seq); err != nil {
					return res, err
				}
				id := ferry.StableID(ctx, "company")
				if _, err := companies.InsertOne(tx, bson.D{{Key: "_id", Value: id.String()}, {Key: "canonical_key", Value: key},
					{Key: "name", Value: in.CompanyName}, {Key: "display_number", Value: seq.Value}, {Key: "member_count", Value: int64(0)}}); err != nil {
					if mongo.IsDuplicateKeyError(err) {
						// Another request created it and committed: the error
						// ended this transaction; the rerun finds the company.
						return res, ferry.RerunTx(err)
					}
					return res, err
				}
				res.CompanyID, res.DisplayNumber, res.CompanyCreated = id, seq.Value, true
			case err != nil:
				return res, err
			default:
				if res.CompanyID, err = uuid.Parse(company.ID); err != nil {
					return res, err
				}
				res.DisplayNumber = company.Number
			}
			n, err := memberships.CountDocuments(tx, bson.D{{Key: "company_id", Value: res.CompanyID.String()}, {Key: "member_id", Value: in.MemberID}})
			if err != nil {
				return res, err
			}
			if n == 0 {
				if _, err := memberships.InsertOne(tx, bson.D{{Key: "company_id", Value: res.CompanyID.String()}, {Key: "member_id", Value: in.MemberID}, {Key: "role", Value: in.Role}}); err != nil {
					if mongo.IsDuplicateKeyError(err) {
						return res, ferry.RerunTx(err)
					}
					return res, err
				}
				res.MembershipCreated = true
			}
			var after struct {
				Count int64 `bson:"member_count"`
			}
			inc := int64(0)
			if res.MembershipCreated {
				inc = 1
			}
			if err := companies.FindOneAndUpdate(tx, bson.D{{Key: "_id", Value: res.CompanyID.String()}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "member_count", Value: inc}}}},
				options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&after); err != nil {
				return res, err
			}
			res.MemberCount = after.Count
			if res.MembershipCreated {
				payload, err := json.Marshal(map[string]any{"company_id": res.CompanyID, "member_id": in.MemberID, "role": in.Role, "request_id": requestID})
				if err != nil {
					return res, err
				}
				ev := &ferry.Event{Topic: "companies", Key: res.CompanyID.String(), Type: "MembershipLinked", ContentType: "application/json", Payload: payload}
				if err := a.client.EmitTx(ctx, tx, ev); err != nil {
					return res, err
				}
				res.EventID = ev.ID
			}
			return res, nil
		})
}
