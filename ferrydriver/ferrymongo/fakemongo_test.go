package ferrymongo_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymongo"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// fakeDriver returns a driver, migrated, on a server of its own:
// testdata/fakemongo.py, which evaluates the commands the real driver
// sends (mongomock under mockupdb's wire protocol) with MongoDB's write
// conflicts between transactions, but reads committed data where MongoDB
// reads a snapshot.
func fakeDriver(t *testing.T) *ferrymongo.Driver {
	t.Helper()
	uri, _ := pythonServer(t, "mockupdb, mongomock", "testdata/fakemongo.py")
	drv, err := ferrymongo.New(context.Background(), mockClient(t, uri), "ferrytest", &ferrymongo.Config{RecoveryMargin: time.Millisecond})
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv
}

// TestFakeServerInbox runs the inbox suite, the conformance table with it,
// on the fake server, where no MongoDB server exists: MongoDB's claims,
// runs, finishes, rescues, retractions, policy changes and settlement
// against the model and the other backends' tests. With
// FERRY_TEST_MONGODB_URL set, TestInboxSuite runs all of it on a real one.
func TestFakeServerInbox(t *testing.T) {
	ferrydrivertest.ExerciseInboxCases(t, func(t *testing.T) ferrydrivertest.InboxDriver[context.Context] { return fakeDriver(t) },
		"InsertAbsorbsDuplicates", "EdgeCaseEventsArriveExactly", "ClaimsHeadsInKeyOrder", "CompleteCommitsWithHandlerTx",
		"ExpiredClaimIsReclaimed", "ReapedClaimIsRescued", "ExpiredRunsAreRescuedKeyByKey", "StaleAttemptCannotFinishALaterClaim",
		"ExhaustedAttemptsGoDeadAtClaim", "UncountedFailureTakesTheAttemptBack", "FailedRetriesWhenDue", "DeadHoldsOrContinues",
		"DeadLettersListRedriveDiscard", "RetentionOfProcessed", "DeadRowsPageByCursor",
		"AwaitSettled", "PolicyChangesAndContinueRedrive", "ConformsToTheModel", "AttemptHistory", "Retract",
		// Not InterruptedPolicyChangeResumes (1,200 keys) nor
		// ConcurrentWorkersKeepKeyOrder (300 events through four workers):
		// on a server that scans every collection in Python they take from
		// half a minute to several, past their deadlines on a busy machine.
		// Transactions that conflict are InsertAbsorbsDuplicates's.
	)
}

// TestFakeServerIngestClaims runs the suite of InsertInboxClaim (a
// delivery that claims what it can run at once) on the fake server.
func TestFakeServerIngestClaims(t *testing.T) {
	ferrydrivertest.ExerciseInboxIngestClaims(t, func(t *testing.T) ferrydrivertest.IngestClaimDriver[context.Context] { return fakeDriver(t) })
}

// TestFakeServerTransactor runs the RunTx transactor suite (request
// records, concurrent claims of one request, rollbacks, retention) on the
// fake server.
func TestFakeServerTransactor(t *testing.T) {
	ferrydrivertest.ExerciseTransactor(t, func(t *testing.T) ferrydrivertest.TransactorDriver[context.Context] { return fakeDriver(t) })
}

// TestFakeServerUpgradeRunsRowsClaimedUnderVersion5: a row that a
// consumer of version 5 left claimed (stored PROCESSING, its claim on the
// row) runs again after Migrate, its counted attempt kept, and the key's
// later row after it.
func TestFakeServerUpgradeRunsRowsClaimedUnderVersion5(t *testing.T) {
	ctx := context.Background()
	uri, _ := pythonServer(t, "mockupdb, mongomock", "testdata/fakemongo.py")
	client := mockClient(t, uri)
	drv, err := ferrymongo.New(ctx, client, "ferrytest", nil)
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	a, b := ferrydrivertest.Event("t", "k", "a"), ferrydrivertest.Event("t", "k", "b")
	inserted, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: []*ferryevent.Event{a, b}})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, inserted)
	// As version 5 left them: a claimed for an hour, the key waiting for
	// the claim's expiry.
	later := time.Now().Add(time.Hour).UTC()
	db := client.Database("ferrytest")
	_, err = db.Collection("ferry_inbox").UpdateOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "g", Value: "g"}, {Key: "e", Value: a.ID.String()}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: "processing"}, {Key: "attempts", Value: 1}, {Key: "claimed_by", Value: "old"},
			{Key: "claim_token", Value: "x"}, {Key: "claim_expires_at", Value: later}}}})
	require.NoError(t, err)
	_, err = db.Collection("ferry_inbox_keys").UpdateOne(ctx, bson.D{{Key: "g", Value: "g"}, {Key: "k", Value: "k"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "runnable_at", Value: later}}}})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)

	ferrydrivertest.RunsClaimedRowsAgain(ctx, t, drv, "g", a, b)
}
