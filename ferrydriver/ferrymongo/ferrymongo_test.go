package ferrymongo_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymongo"
	"github.com/ferry-dev/ferry/ferryui/ferryuitest"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// mongoClient connects to FERRY_TEST_MONGODB_URL (a replica set). Without
// the variable the integration tests skip: no MongoDB server can run on
// the project's machines. With it set, an unreachable server fails them.
func mongoClient(t *testing.T) *mongo.Client {
	t.Helper()
	url := os.Getenv("FERRY_TEST_MONGODB_URL")
	if url == "" {
		t.Skip("set FERRY_TEST_MONGODB_URL to a replica set (mongodb://127.0.0.1:27017/?replicaSet=rs0) to run the MongoDB integration tests")
	}
	client, err := mongo.Connect(options.Client().ApplyURI(url))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, client.Ping(ctx, nil), "FERRY_TEST_MONGODB_URL=%s is set but the server does not answer", url)
	// Transactions cannot race to create it implicitly.
	if err := client.Database("ferrytest_scratch").CreateCollection(ctx, "writes"); err != nil && !strings.Contains(err.Error(), "already exists") {
		require.NoError(t, err)
	}
	return client
}

// newDriver returns a driver over a fresh database, dropped afterwards.
func newDriver(t *testing.T) *ferrymongo.Driver {
	t.Helper()
	drv, _ := newPartitioned(t, 0)
	return drv
}

// newPartitioned returns a driver over a fresh database migrated with n
// partitions, and a function that opens others on it.
func newPartitioned(t *testing.T, n int) (*ferrymongo.Driver, func(int) *ferrymongo.Driver) {
	t.Helper()
	client := mongoClient(t)
	name := fmt.Sprintf("ferrytest_%d_%d", time.Now().UnixNano()%1e9, rand.IntN(1e6))
	t.Cleanup(func() { _ = client.Database(name).Drop(context.Background()) })
	open := func(n int) *ferrymongo.Driver {
		// A short recovery margin, so that retention tests see deletions.
		drv, err := ferrymongo.New(context.Background(), client, name, &ferrymongo.Config{RecoveryMargin: time.Millisecond, Partitions: n})
		require.NoError(t, err)
		return drv
	}
	drv := open(n)
	_, err := drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv, open
}

// begin starts a session transaction; its context is the TTx.
func begin(ctx context.Context, t *testing.T, client *mongo.Client) (context.Context, *mongo.Session) {
	sess, err := client.StartSession()
	require.NoError(t, err)
	require.NoError(t, sess.StartTransaction(options.Transaction().SetWriteConcern(writeconcern.Majority()).SetReadConcern(readconcern.Snapshot())))
	t.Cleanup(func() { _ = sess.AbortTransaction(context.Background()); sess.EndSession(context.Background()) })
	return mongo.NewSessionContext(ctx, sess), sess
}

func TestDriverSuite(t *testing.T) {
	client := mongoClient(t)
	ferrydrivertest.Exercise(t, ferrydrivertest.Harness[context.Context]{
		New: func(t *testing.T) ferrydriver.Driver[context.Context] { return newDriver(t) },
		Begin: func(ctx context.Context, t *testing.T, drv ferrydriver.Driver[context.Context]) ferrydrivertest.Tx[context.Context] {
			sc, sess := begin(ctx, t, client)
			return ferrydrivertest.Tx[context.Context]{
				Tx: sc,
				// A write elsewhere starts the transaction on the server
				// before it writes any event.
				TakeXID: func() error {
					_, err := client.Database("ferrytest_scratch").Collection("writes").InsertOne(sc, bson.D{{Key: "at", Value: time.Now()}})
					return err
				},
				Commit:   func() error { return sess.CommitTransaction(ctx) },
				Rollback: func() error { return sess.AbortTransaction(ctx) },
			}
		},
		HoldWriter: func(ctx context.Context, t *testing.T) func() {
			sc, sess := begin(ctx, t, client)
			_, err := client.Database("ferrytest_scratch").Collection("writes").InsertOne(sc, bson.D{{Key: "held", Value: true}})
			require.NoError(t, err)
			return func() { _ = sess.AbortTransaction(context.Background()) }
		},
		NewPartitioned: func(t *testing.T, n int) (ferrydriver.Driver[context.Context], func(int) ferrydriver.Driver[context.Context]) {
			drv, open := newPartitioned(t, n)
			return drv, func(n int) ferrydriver.Driver[context.Context] { return open(n) }
		},
		// Writers of one key conflict on its sequence document and abort.
		Retryable: func(err error) bool {
			var le mongo.LabeledError
			return errors.As(err, &le) && le.HasErrorLabel("TransientTransactionError")
		},
	})
}

// TestStandaloneIsRefused runs only against a server: a standalone one
// (FERRY_TEST_MONGODB_STANDALONE_URL) must be refused with the fix.
func TestStandaloneIsRefused(t *testing.T) {
	url := os.Getenv("FERRY_TEST_MONGODB_STANDALONE_URL")
	if url == "" {
		t.Skip("set FERRY_TEST_MONGODB_STANDALONE_URL to a standalone mongod to run this test (the mockupdb test covers it otherwise)")
	}
	client, err := mongo.Connect(options.Client().ApplyURI(url))
	require.NoError(t, err)
	defer client.Disconnect(context.Background())
	_, err = ferrymongo.New(context.Background(), client, "x", nil)
	require.ErrorContains(t, err, "rs.initiate()")
}

func TestTransactorSuite(t *testing.T) {
	mongoClient(t)
	ferrydrivertest.ExerciseTransactor(t, func(t *testing.T) ferrydrivertest.TransactorDriver[context.Context] { return newDriver(t) })
}

func TestActivitySuite(t *testing.T) {
	mongoClient(t)
	ferrydrivertest.ExerciseActivity(t, ferrydrivertest.ActivityHarness{ServerExpires: true,
		New: func(t *testing.T) ferrydriver.Admin { return newDriver(t) }})
}

func TestInboxSuite(t *testing.T) {
	mongoClient(t)
	ferrydrivertest.ExerciseInbox(t, func(t *testing.T) ferrydrivertest.InboxDriver[context.Context] { return newDriver(t) })
}

func TestInboxIngestClaimSuite(t *testing.T) {
	mongoClient(t)
	ferrydrivertest.ExerciseInboxIngestClaims(t, func(t *testing.T) ferrydrivertest.IngestClaimDriver[context.Context] { return newDriver(t) })
}

// TestAdminAPISuite runs the admin API (ferryui) over MongoDB.
func TestAdminAPISuite(t *testing.T) {
	mongoClient(t)
	drv := newDriver(t)
	ferryuitest.Run(t, drv, drv)
}

func TestConsumerSuite(t *testing.T) {
	client := mongoClient(t)
	ferrydrivertest.ExerciseConsumer(t, ferrydrivertest.ConsumerHarness[context.Context]{
		New: func(t *testing.T) ferrydrivertest.InboxDriver[context.Context] { return newDriver(t) },
		Effects: func(t *testing.T, d ferrydrivertest.InboxDriver[context.Context]) (func(context.Context, context.Context, *ferryevent.Event) error, func(context.Context) (map[uuid.UUID]int, error)) {
			coll := client.Database("ferrytest_scratch").Collection(fmt.Sprintf("effects_%d_%d", time.Now().UnixNano()%1e9, rand.IntN(1e6)))
			ctx := context.Background()
			require.NoError(t, client.Database("ferrytest_scratch").CreateCollection(ctx, coll.Name()))
			t.Cleanup(func() { _ = coll.Drop(context.Background()) })
			record := func(_ context.Context, tx context.Context, ev *ferryevent.Event) error {
				_, err := coll.InsertOne(tx, bson.D{{Key: "event_id", Value: ev.ID.String()}})
				return err
			}
			counts := func(ctx context.Context) (map[uuid.UUID]int, error) {
				cur, err := coll.Find(ctx, bson.D{})
				if err != nil {
					return nil, err
				}
				var docs []struct {
					ID string `bson:"event_id"`
				}
				if err := cur.All(ctx, &docs); err != nil {
					return nil, err
				}
				out := map[uuid.UUID]int{}
				for _, d := range docs {
					out[uuid.MustParse(d.ID)]++
				}
				return out, nil
			}
			return record, counts
		},
	})
}

// TestCaptureOnAServer: the non-outbox mode against a real server. Inserts,
// updates (with pre- and post-images where the server records them) and
// deletes of a business collection come out as events in order, and Ferry's
// own collections are left out.
func TestCaptureOnAServer(t *testing.T) {
	drv := newDriver(t)
	client := mongoClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	capture, err := drv.Capture(&ferrymongo.CaptureConfig{Collections: []string{"customers"},
		PostImage: ferrymongo.ImageUpdateLookup, PreImage: ferrymongo.ImageWhenAvailable})
	require.NoError(t, err)
	db := drv.Database().Name()
	coll := client.Database(db).Collection("customers")
	require.NoError(t, client.Database(db).CreateCollection(ctx, "customers"))
	imagesOn := capture.EnableImages(ctx) == nil // MongoDB 6.0+
	f, err := capture.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "capture"})
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 100 * time.Millisecond}) // the stream starts now
	require.NoError(t, err)

	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "c-1"}, {Key: "tier", Value: "silver"}})
	require.NoError(t, err)
	_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "c-1"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "tier", Value: "gold"}}}})
	require.NoError(t, err)
	_, err = coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: "c-1"}})
	require.NoError(t, err)
	require.NoError(t, drv.Append(ctx, []*ferryevent.Event{{ID: ferryevent.NewID(), Topic: "t", Key: "k", Type: "T", CreatedAt: time.Now()}}))

	var got []*ferryevent.Event
	for len(got) < 3 && ctx.Err() == nil {
		b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
		require.NoError(t, err)
		got = append(got, b.Events...)
	}
	require.Len(t, got, 3)
	for i, typ := range []string{"mongodb.insert", "mongodb.update", "mongodb.delete"} {
		require.Equal(t, typ, got[i].Type)
		require.Equal(t, "customers", got[i].Topic)
		require.Equal(t, "c-1", got[i].Key)
	}
	if imagesOn {
		require.Contains(t, string(got[1].Payload), `"fullDocumentBeforeChange":{"_id":"c-1","tier":"silver"}`)
	}
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 500 * time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, b.Events, "Ferry's outbox is not captured")
}
