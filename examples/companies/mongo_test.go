package companies_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/examples/companies"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymongo"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The verification matrix on MongoDB. It runs when FERRY_TEST_MONGODB_URL
// names a replica set; no MongoDB server can run on this project's
// machines, so it skips there.

type mongoEnv struct {
	app     *companies.MongoApp
	drv     *ferrymongo.Driver
	db      *mongo.Database
	retries *retryLog
}

func newMongoEnv(t *testing.T) *mongoEnv {
	url := os.Getenv("FERRY_TEST_MONGODB_URL")
	if url == "" {
		t.Skip("set FERRY_TEST_MONGODB_URL to a replica set (mongodb://127.0.0.1:27017/?replicaSet=rs0) to run the MongoDB matrix")
	}
	ctx := context.Background()
	client, err := mongo.Connect(options.Client().ApplyURI(url))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	name := fmt.Sprintf("ferrytest_companies_%d_%d", time.Now().UnixNano()%1e9, rand.IntN(1e6))
	db := client.Database(name)
	t.Cleanup(func() { _ = db.Drop(context.Background()) })
	drv, err := ferrymongo.New(ctx, client, name, nil)
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	e := &mongoEnv{drv: drv, db: db, retries: &retryLog{causes: map[string]int{}}}
	e.app, err = companies.NewMongo(drv, db, slog.New(e.retries))
	require.NoError(t, err)
	require.NoError(t, e.app.Migrate(ctx))
	return e
}

func (e *mongoEnv) count(t *testing.T, coll string, filter bson.D) int64 {
	n, err := e.db.Collection(coll).CountDocuments(context.Background(), filter)
	require.NoError(t, err)
	return n
}

func (e *mongoEnv) check(t *testing.T, results map[string]companies.LinkResult) {
	t.Helper()
	ctx := context.Background()
	cur, err := e.db.Collection("companies").Find(ctx, bson.D{})
	require.NoError(t, err)
	var cs []struct {
		ID      string `bson:"_id"`
		Key     string `bson:"canonical_key"`
		Number  int64  `bson:"display_number"`
		Members int64  `bson:"member_count"`
	}
	require.NoError(t, cur.All(ctx, &cs))
	keys := map[string]bool{}
	var maxNumber int64
	for _, c := range cs {
		require.False(t, keys[c.Key], "one company per key")
		keys[c.Key] = true
		require.Equal(t, e.count(t, "memberships", bson.D{{Key: "company_id", Value: c.ID}}), c.Members, "counter of %s equals its memberships", c.Key)
		maxNumber = max(maxNumber, c.Number)
	}
	require.EqualValues(t, len(cs), maxNumber, "display numbers 1..N, no gaps")
	require.Equal(t, e.count(t, "memberships", bson.D{}), e.count(t, "ferry_outbox", bson.D{{Key: "type", Value: "MembershipLinked"}}), "one event per membership")
	for id, want := range results {
		rec, err := e.drv.GetRequest(ctx, id)
		require.NoError(t, err)
		var got companies.LinkResult
		require.NoError(t, jsonUnmarshal(rec.Result, &got))
		require.Equal(t, want, got, "request %s", id)
	}
}

func TestMongoMatrix(t *testing.T) {
	t.Run("SameCompanyDifferentRequests", func(t *testing.T) {
		e := newMongoEnv(t)
		ctx := context.Background()
		spellings := []string{"Acme Inc.", "ACME, INC", "acme", "Acme Incorporated"}
		results := runConcurrently(t, 32, func(i int) (string, companies.LinkResult, error) {
			id := "same-" + strconv.Itoa(i)
			res, err := e.app.LinkCompany(ctx, id, companies.LinkInput{CompanyName: spellings[i%len(spellings)], MemberID: "m" + strconv.Itoa(i), Role: "member"})
			return id, res, err
		})
		require.Len(t, results, 32)
		require.EqualValues(t, 1, e.count(t, "companies", bson.D{}))
		e.check(t, results)
		t.Logf("retries %v", e.retries.snapshot())
	})
	t.Run("ResentRequest", func(t *testing.T) {
		e := newMongoEnv(t)
		ctx := context.Background()
		in := companies.LinkInput{CompanyName: "Globex", BusinessNumber: "123-45-67890", MemberID: "alice", Role: "owner"}
		results := runConcurrently(t, 16, func(i int) (string, companies.LinkResult, error) {
			res, err := e.app.LinkCompany(ctx, "req-1", in)
			return "req-1", res, err
		})
		again, err := e.app.LinkCompany(ctx, "req-1", in)
		require.NoError(t, err)
		require.Equal(t, results["req-1"], again)
		require.EqualValues(t, 1, e.count(t, "memberships", bson.D{}))
		other := in
		other.MemberID = "mallory"
		_, err = e.app.LinkCompany(ctx, "req-1", other)
		var conflict *ferry.RequestConflictError
		require.ErrorAs(t, err, &conflict)
		e.check(t, results)
	})
	t.Run("DifferentCompaniesShareTheSequence", func(t *testing.T) {
		e := newMongoEnv(t)
		ctx := context.Background()
		results := runConcurrently(t, 32, func(i int) (string, companies.LinkResult, error) {
			id := "co-" + strconv.Itoa(i)
			res, err := e.app.LinkCompany(ctx, id, companies.LinkInput{CompanyName: "Company " + strconv.Itoa(i), MemberID: "founder", Role: "owner"})
			return id, res, err
		})
		require.Len(t, results, 32)
		var numbers []int
		for _, r := range results {
			numbers = append(numbers, int(r.DisplayNumber))
		}
		sort.Ints(numbers)
		for i, n := range numbers {
			require.Equal(t, i+1, n)
		}
		e.check(t, results)
		require.Positive(t, e.retries.total(), "the shared document made transactions conflict and rerun")
		t.Logf("retries by cause %v", e.retries.snapshot())
	})
	t.Run("Contention", func(t *testing.T) {
		e := newMongoEnv(t)
		ctx := context.Background()
		d := 5 * time.Second
		stop := time.Now().Add(d)
		var mu sync.Mutex
		results := map[string]companies.LinkResult{}
		var wg sync.WaitGroup
		for w := range 32 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 3))
				for i := 0; time.Now().Before(stop); i++ {
					id := fmt.Sprintf("w%d-%d", w, i)
					res, err := e.app.LinkCompany(ctx, id, companies.LinkInput{BusinessNumber: fmt.Sprintf("10000-%d", rng.IntN(8)), CompanyName: "Co", MemberID: fmt.Sprintf("m%d", rng.IntN(40)), Role: "member"})
					var ex *ferry.TxRetriesExhaustedError
					if errors.As(err, &ex) {
						continue
					}
					if err != nil {
						t.Errorf("%s: %v", id, err)
						return
					}
					mu.Lock()
					results[id] = res
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		e.check(t, results)
		t.Logf("%d requests in %v; retries by cause %v", len(results), d, e.retries.snapshot())
	})
}
