package ferrymongo_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymongo"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// mockServer starts testdata/mockserver.py with a scenario: a scripted
// server that answers the real Go driver exactly as a MongoDB server of
// that kind would. It needs Debian's python3-mockupdb (/usr/bin/python3;
// .ci/run installs it); without it the test skips, or fails under CI=true.
func mockServer(t *testing.T, scenario string) string {
	uri, _ := mockServerLines(t, scenario)
	return uri
}

// mockServerLines is mockServer with the JSON lines the script reports
// about the commands it received.
func mockServerLines(t *testing.T, scenario string) (string, <-chan string) {
	t.Helper()
	return pythonServer(t, "mockupdb", "testdata/mockserver.py", scenario)
}

// pythonServer runs a server script of testdata with Debian's python
// (/usr/bin/python3), which must have the modules named; it skips without
// them, or fails under CI=true (.ci/services installs them). It returns
// the URI the script prints first and the lines it prints after.
func pythonServer(t *testing.T, modules, script string, args ...string) (string, <-chan string) {
	t.Helper()
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import "+modules).CombinedOutput(); err != nil {
		msg := fmt.Sprintf("%s needs Debian's python3-mockupdb and python3-mongomock (apt-get install python3-mockupdb python3-mongomock): %v: %s", script, err, out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cmd := exec.Command(py, append([]string{script}, args...)...)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	require.NoError(t, err, "%s did not start", script)
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			lines <- strings.TrimSpace(l)
		}
	}()
	return strings.TrimSpace(line), lines
}

// awaitReports waits for the next n commands the mock server reports.
func awaitReports(ctx context.Context, t *testing.T, lines <-chan string, n int) []string {
	t.Helper()
	var reports []string
	for len(reports) < n {
		select {
		case l := <-lines:
			reports = append(reports, l)
		case <-ctx.Done():
			t.Fatalf("the mock server reported %d of %d commands: %v", len(reports), n, reports)
		}
	}
	return reports
}

func mockClient(t *testing.T, uri string) *mongo.Client {
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetDirect(true).SetServerSelectionTimeout(5 * time.Second))
	require.NoError(t, err)
	t.Cleanup(func() {
		// The scripted server does not answer everything a disconnect
		// sends: do not wait for it.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	return client
}

// A standalone server cannot run change streams or transactions: New
// refuses it at once and says how to make it a replica set.
func TestMockStandaloneIsRefusedWithTheFix(t *testing.T) {
	client := mockClient(t, mockServer(t, "standalone"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := ferrymongo.New(ctx, client, "app", nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), "--replSet")
	require.Contains(t, err.Error(), "rs.initiate()")
}

// mongos (a sharded cluster) is accepted.
func TestMockMongosIsAccepted(t *testing.T) {
	client := mockClient(t, mockServer(t, "mongos"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
}

// TestMockHistoryLostRecoversFromTheOutbox: the real driver gets error 286
// (ChangeStreamHistoryLost) on its getMore. The feed does not skip: it
// scans the outbox per key in sequence order, then opens a new stream at
// the cluster time read before the scan.
func TestMockHistoryLostRecoversFromTheOutbox(t *testing.T) {
	uri, lines := mockServerLines(t, "historylost")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "default/0"})
	require.NoError(t, err)
	defer f.Close()

	// The first read meets the lost position: no events, and a cursor
	// that says "recovering", which the relay saves like any other.
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.NoError(t, err)
	require.Empty(t, b.Events)
	require.Contains(t, string(b.Cursor), `"recover":true`)

	b, err = f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.NoError(t, err)
	var got []string
	for _, ev := range b.Events {
		got = append(got, ev.Key+string(ev.Payload)[1:]+"#"+strconv.FormatInt(ev.Seq, 10))
	}
	require.Equal(t, []string{"a1#1", "a2#2", "b1#1"}, got, "every event of the outbox, per key in order")

	b, err = f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 300 * time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, b.Events)

	var reports []map[string]any
	for _, l := range awaitReports(ctx, t, lines, 3) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		reports = append(reports, m)
	}
	require.Equal(t, "aggregate", reports[0]["kind"])
	require.Equal(t, "find", reports[1]["kind"])
	require.Contains(t, fmt.Sprint(reports[1]["doc"]), "sort:map[key:1 seq:1]", "the scan goes per key in sequence order")
	require.Contains(t, fmt.Sprint(reports[1]["doc"]), "afterClusterTime", "the scan reads at or after the cluster time taken before it")
	require.Equal(t, "aggregate", reports[2]["kind"])
	require.Contains(t, fmt.Sprint(reports[2]["doc"]), "startAtOperationTime", "the new stream starts at the cluster time taken before the scan")
	require.Contains(t, fmt.Sprint(reports[2]["doc"]), "1700000000")
}

// TestMockQuietStreamPositionMoves: a feed with no position starts at the
// outbox's creation time; on a quiet outbox its position follows the
// postBatchResumeToken, so that it never ages out of the oplog; a feed
// opened from it starts after it.
func TestMockQuietStreamPositionMoves(t *testing.T) {
	uri, lines := mockServerLines(t, "quiet")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "default/0"})
	require.NoError(t, err)
	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 500 * time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, b.Events)
	require.NoError(t, f.Close())
	var pos struct {
		Token []byte `json:"token"`
	}
	require.NoError(t, json.Unmarshal(b.Cursor, &pos))
	require.Equal(t, "00BB", bson.Raw(pos.Token).Lookup("_data").StringValue(), "the position is the latest postBatchResumeToken")

	g, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "default/0", Cursor: b.Cursor})
	require.NoError(t, err)
	defer g.Close()
	_, err = g.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 100 * time.Millisecond})
	require.NoError(t, err)
	reports := awaitReports(ctx, t, lines, 2)
	require.Contains(t, reports[0], "startAtOperationTime", "a feed with no position starts where the outbox was created")
	require.Contains(t, reports[0], "1690000000")
	require.Contains(t, reports[1], `"startAfter": {"_data": "00BB"}`, "a saved feed starts after its token")
}

// TestMockRetentionCheckReadsTheOplogWindow: retention shorter than the
// oplog window plus the outage allowance is reported with what to do.
func TestMockRetentionCheckReadsTheOplogWindow(t *testing.T) {
	client := mockClient(t, mockServer(t, "oplog"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", &ferrymongo.Config{OutageAllowance: 12 * time.Hour})
	require.NoError(t, err)
	warning, err := drv.CheckRetention(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.Contains(t, warning, "oplog window 20h0m0s")
	require.Contains(t, warning, "at least 32h0m0s")
}

// TestMockUnknownCommitRetriesOnlyTheCommit: commits answered
// UnknownTransactionCommitResult are retried, with majority write concern,
// and the callback's writes are not sent again.
func TestMockUnknownCommitRetriesOnlyTheCommit(t *testing.T) {
	uri, lines := mockServerLines(t, "commitunknown")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	runs := 0
	err = drv.AttemptTx(ctx, func(ctx context.Context, tx context.Context) error {
		runs++
		_, err := client.Database("app").Collection("things").InsertOne(tx, bson.D{{Key: "n", Value: 1}})
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 1, runs, "the callback ran once")
	reports := awaitReports(ctx, t, lines, 4)
	require.Contains(t, reports[0], `"kind": "insert"`)
	for _, r := range reports[1:] {
		require.Contains(t, r, `"kind": "commit"`)
	}
	require.Contains(t, reports[3], `"w": "majority"`, "a retried commit uses majority write concern")
	select {
	case l := <-lines:
		t.Fatalf("the driver sent more: %s", l)
	case <-time.After(4 * time.Second):
	}
}

// TestMockInvalidTokenAtOpenRecovers: the saved token is refused when the
// stream opens (InvalidResumeToken, which no driver resumes from): the
// feed scans the outbox from the last acknowledged append time minus the
// margin, then streams again from the cluster time read before the scan.
func TestMockInvalidTokenAtOpenRecovers(t *testing.T) {
	uri, lines := mockServerLines(t, "badtoken")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", &ferrymongo.Config{RecoveryMargin: time.Minute})
	require.NoError(t, err)
	token, err := bson.Marshal(bson.D{{Key: "_data", Value: "00AA"}})
	require.NoError(t, err)
	saved, err := json.Marshal(map[string]any{"token": token, "at": time.Date(2026, 1, 2, 3, 10, 0, 0, time.UTC)})
	require.NoError(t, err)
	f, err := drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "default/0", Cursor: saved})
	require.NoError(t, err)
	defer f.Close()

	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.NoError(t, err)
	require.Empty(t, b.Events)
	require.Contains(t, string(b.Cursor), `"recover":true`)
	b, err = f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Events, 1)
	require.EqualValues(t, 7, b.Events[0].Seq)
	_, err = f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 200 * time.Millisecond})
	require.NoError(t, err)

	reports := awaitReports(ctx, t, lines, 3)
	require.Contains(t, reports[0], "startAfter")
	require.Contains(t, reports[1], "appended_at", "the scan starts from the last acknowledged append time")
	require.Contains(t, reports[1], "2026-01-02 03:09:00", "minus the recovery margin")
	require.Contains(t, reports[2], "startAtOperationTime")
}

// TestMockRetentionTTLIndexFollowsTheConfig: Migrate creates, changes in
// place (collMod) or drops the outbox's TTL index to match
// Config.RetentionTTL.
func TestMockRetentionTTLIndexFollowsTheConfig(t *testing.T) {
	uri, lines := mockServerLines(t, "ttl")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ttl := range []time.Duration{2 * time.Hour, 0, time.Hour} {
		drv, err := ferrymongo.New(ctx, client, "app", &ferrymongo.Config{RetentionTTL: ttl})
		require.NoError(t, err)
		_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
		require.NoError(t, err, "RetentionTTL %v", ttl)
	}
	reports := awaitReports(ctx, t, lines, 3)
	require.Contains(t, reports[0], `"kind": "collMod"`)
	require.Contains(t, reports[0], `"expireAfterSeconds": 7200`)
	require.Contains(t, reports[1], `"kind": "dropIndexes"`)
	require.Contains(t, reports[1], `"index": "ferry_retention_ttl"`)
	require.Contains(t, reports[2], `"kind": "createIndexes"`)
	require.Contains(t, reports[2], `"expireAfterSeconds": 3600`)
	require.Contains(t, reports[2], `"appended_at": 1`)

	_, err := ferrymongo.New(ctx, client, "app", &ferrymongo.Config{RetentionTTL: time.Millisecond})
	require.ErrorContains(t, err, "RetentionTTL")
}

// TestMockCaptureRelaysChangesWithImages: the non-outbox mode watches the
// database with the images asked for, turns each change into an event
// (topic from the collection, key from _id, JSON payload with both
// images), stops when history is lost unless allowed to skip to the
// present, and then starts at the present cluster time.
func TestMockCaptureRelaysChangesWithImages(t *testing.T) {
	uri, lines := mockServerLines(t, "capture")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	capture, err := drv.Capture(&ferrymongo.CaptureConfig{Collections: []string{"customers", "orders"},
		PostImage: ferrymongo.ImageWhenAvailable, PreImage: ferrymongo.ImageRequired})
	require.NoError(t, err)
	f, err := capture.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "capture"})
	require.NoError(t, err)
	defer f.Close()

	b, err := f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Events, 2)
	up, ins := b.Events[0], b.Events[1]
	require.Equal(t, "customers", up.Topic)
	require.Equal(t, "c-1", up.Key)
	require.Equal(t, "mongodb.update", up.Type)
	require.Zero(t, up.Seq, "no per-key sequence without an outbox")
	require.Equal(t, time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC), up.CreatedAt)
	var payload map[string]any
	require.NoError(t, json.Unmarshal(up.Payload, &payload))
	require.Equal(t, map[string]any{"_id": "c-1", "tier": "silver"}, payload["fullDocumentBeforeChange"])
	require.Equal(t, map[string]any{"_id": "c-1", "tier": "gold"}, payload["fullDocument"])
	require.Equal(t, map[string]any{"tier": "gold"}, payload["updateDescription"].(map[string]any)["updatedFields"])
	require.Equal(t, "orders", ins.Topic)
	require.Equal(t, "64b7f0c2a1b2c3d4e5f60718", ins.Key)
	require.NotEqual(t, up.ID, ins.ID)
	saved := b.Cursor

	_, err = f.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.ErrorContains(t, err, "ResumeFromNowOnHistoryLost")
	require.ErrorContains(t, err, "ChangeStreamHistoryLost")

	skip, err := drv.Capture(&ferrymongo.CaptureConfig{Collections: []string{"customers", "orders"}, ResumeFromNowOnHistoryLost: true})
	require.NoError(t, err)
	g, err := skip.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "capture", Cursor: saved})
	require.NoError(t, err)
	defer g.Close()
	b, err = g.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: time.Second})
	require.NoError(t, err)
	require.Empty(t, b.Events)
	b, err = g.Read(ctx, &ferrydriver.ReadParams{Max: 10, Wait: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, b.Events)

	reports := awaitReports(ctx, t, lines, 3)
	require.Contains(t, reports[0], `"fullDocument": "whenAvailable"`)
	require.Contains(t, reports[0], `"fullDocumentBeforeChange": "required"`)
	require.Contains(t, reports[0], `"$in": ["customers", "orders"]`)
	require.Contains(t, reports[1], `"startAfter"`, "the second feed resumes after the saved token")
	require.Contains(t, reports[1], "82AA02")
	require.Contains(t, reports[2], `"startAtOperationTime"`, "then starts at the present")

	_, err = drv.Capture(&ferrymongo.CaptureConfig{PreImage: ferrymongo.ImageUpdateLookup})
	require.ErrorContains(t, err, "PreImage")
	_, err = drv.Capture(&ferrymongo.CaptureConfig{Collections: []string{"ferry_outbox"}})
	require.ErrorContains(t, err, "Ferry's own")
	_, err = capture.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "default/0", Cursor: []byte(`{"token":"AA=="}`)})
	require.ErrorContains(t, err, "not a capture position")
}

// TestMockFeedLagIsBoundedAndExtrapolated: the relay's heartbeat counts at
// most ExactCountLimit events after the checkpoint (sorted by append
// time, so by the (p, appended_at) index) and extrapolates their density
// up to the partition's newest append: 1000 events in the first 10 s of
// 30 s of backlog are about 3000.
func TestMockFeedLagIsBoundedAndExtrapolated(t *testing.T) {
	uri, lines := mockServerLines(t, "lag")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	lag, err := drv.FeedLag(ctx, &ferrydriver.FeedLagParams{Feed: "default/0"})
	require.NoError(t, err)
	require.True(t, lag.Estimated)
	require.InDelta(t, 3000, lag.Events, 5)
	require.Equal(t, time.Date(2026, 5, 1, 11, 59, 0, 0, time.UTC), lag.OldestPending.UTC())

	reports := awaitReports(ctx, t, lines, 2)
	require.Contains(t, reports[0], `"$limit": 1000`, "the count stops at ExactCountLimit")
	require.Contains(t, reports[0], `"$sort": {"appended_at": 1}`)
	require.Contains(t, reports[0], `"$gt": "2026-05-01 11:59:59`, "it counts after the checkpoint's position")
	require.Contains(t, reports[1], `"sort": {"appended_at": -1}`, "the newest append, by index")
}

// TestMockDeadLetterRetentionIsBounded: the relay's retention of dead
// letters reads the feed's oldest expired ones, a chunk at a time, by the
// (feed, failed_at) index, and deletes those, repeating the filter.
func TestMockDeadLetterRetentionIsBounded(t *testing.T) {
	uri, lines := mockServerLines(t, "dlretention")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	n, err := drv.DeleteDeadLetters(ctx, &ferrydriver.DeleteDeadLettersParams{Feed: "default/0", OlderThan: time.Hour, Limit: 500})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	reports := awaitReports(ctx, t, lines, 2)
	require.Contains(t, reports[0], `"feed": "default/0"`)
	require.Contains(t, reports[0], `"failed_at": {"$lt"`)
	require.Contains(t, reports[0], `"sort": {"failed_at": 1}`)
	require.Contains(t, reports[0], `"limit": 500`)
	require.Contains(t, reports[1], `"event": "e1"`)
	require.Contains(t, reports[1], `"failed_at": {"$lt"`, "the delete repeats the filter")
}

// TestMockPruneKeysForgetsOnlyKeysWithNothingLeft: a chunk of the keys
// collection in _id order; a key goes when it has been idle for IdleFor
// and none of its events is left in the outbox (one distinct per chunk),
// and only if its sequence is still the one read.
func TestMockPruneKeysForgetsOnlyKeysWithNothingLeft(t *testing.T) {
	uri, lines := mockServerLines(t, "prunekeys")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	res, err := drv.PruneKeys(ctx, &ferrydriver.PruneKeysParams{IdleFor: 24 * time.Hour, After: "0", Limit: 3})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Pruned)
	require.Equal(t, "c", res.Next, "a full chunk: the sweep goes on after its last key")
	reports := awaitReports(ctx, t, lines, 3)
	require.Contains(t, reports[0], `"_id": {"$gt": "0"}`)
	require.Contains(t, reports[0], `"sort": {"_id": 1}`)
	require.Contains(t, reports[0], `"limit": 3`)
	require.Contains(t, reports[1], `"key": "key"`)
	require.Contains(t, reports[1], `"$in": ["a", "b"]`, "only the idle keys are looked up")
	require.Contains(t, reports[2], `{"_id": "a", "seq": 4}`, "compare-and-delete")
	require.NotContains(t, reports[2], `"b"`)
	require.NotContains(t, reports[2], `"c"`)
}

// TestMockClaimReaping: ClaimHolders reads the workers of the group's live
// claims (on the keys' documents, through their index by rescue time), and
// ExpireClaims ends one worker's live claims now, due for a rescue, in one
// update of every such document.
func TestMockClaimReaping(t *testing.T) {
	uri, lines := mockServerLines(t, "reaper")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	r := drv
	holders, err := r.ClaimHolders(ctx, "billing")
	require.NoError(t, err)
	require.Equal(t, []string{"w1", "w2"}, holders)
	n, err := r.ExpireClaims(ctx, &ferrydriver.ExpireClaimsParams{Group: "billing", Worker: "w1"})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	reports := awaitReports(ctx, t, lines, 2)
	require.Contains(t, reports[0], `"key": "claimed_by"`)
	require.Contains(t, reports[0], `"g": "billing"`)
	require.Contains(t, reports[0], `"claim_expires_at": {"$gt": `)
	require.Contains(t, reports[0], `"rescue_at": {"$gt": `)
	require.Contains(t, reports[1], `"claimed_by": "w1"`)
	require.Contains(t, reports[1], `"claim_expires_at": {"$gt": `, "live claims only")
	require.Contains(t, reports[1], `"$set": {"claim_expires_at": `)
	require.Contains(t, reports[1], `"rescue_at": `)
	require.Contains(t, reports[1], `"multi": true`)
}

// TestMockRedriveParksForItsFeed: a redriven dead letter goes back to the
// feed that dead-lettered it and to no other: in the transaction that
// deletes it, it is parked for its key in that feed, at the feed's next
// position, marked redriven, with its Seq; nothing is appended to the
// outbox, which every feed of the partition reads.
func TestMockRedriveParksForItsFeed(t *testing.T) {
	uri, lines := mockServerLines(t, "redrive")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	const eid = "01a22951-45fe-71e0-943a-d0986a3e5969"
	n, err := drv.RedriveDeadLetters(ctx, []ferrydriver.DeadLetterRef{{Feed: "hooks/0", EventID: uuid.MustParse(eid)}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	reports := awaitReports(ctx, t, lines, 5)
	require.Contains(t, reports[0], `"_id": {"$in": [{"feed": "hooks/0", "event": "`+eid+`"}]}`, "the dead letter named, of its feed")
	require.Contains(t, reports[0], `"sort": {"failed_at": 1, "event.seq": 1}`, "oldest first, in the key's order")
	require.Contains(t, reports[0], `"startTransaction": true`)
	require.Contains(t, reports[1], `"parked:hooks/0"`, "the feed's parked positions")
	require.Contains(t, reports[1], `"$inc": {"n": 1}`)
	require.Contains(t, reports[2], `"_id": {"feed": "hooks/0", "event": "`+eid+`"}`, "parked for that feed")
	require.Contains(t, reports[2], `"pos": 7`, "at its next position")
	require.Contains(t, reports[2], `"redriven": true`)
	require.Contains(t, reports[2], `"seq": 5`, "with its Seq")
	require.Contains(t, reports[2], `"key": "k"`)
	require.Contains(t, reports[3], `"event": "`+eid+`"`)
	require.Contains(t, reports[4], `"kind": "commit"`)
	for _, r := range reports {
		require.NotContains(t, r, "ferry_outbox", "nothing appended to the outbox")
	}
}

// TestMockFeedsAreListedByIndex: ListFeeds asks each collection for its
// distinct names (an index that leads with the feed serves each) and
// merges them, once each, in order; the heads of the keys with redriven
// events are read through their distinct keys, then a head per key.
func TestMockFeedsAreListedByIndex(t *testing.T) {
	uri, lines := mockServerLines(t, "feeds")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	names, err := drv.ListFeeds(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"chain/eth", "default/0", "hooks/0", "hooks/1", "members/default/r1"}, names)
	heads, err := drv.ParkedHeads(ctx, &ferrydriver.ParkedHeadsParams{Feed: "hooks/0", Redriven: true})
	require.NoError(t, err)
	require.Len(t, heads, 1)
	require.True(t, heads[0].Redriven)
	require.EqualValues(t, 5, heads[0].Event.Seq)
	reports := awaitReports(ctx, t, lines, 6)
	require.Contains(t, reports[2], `"key": "feed"`)
	require.Contains(t, reports[3], `"key": "feed"`)
	require.Contains(t, reports[4], `"query": {"feed": "hooks/0", "redriven": true}`, "the keys with redriven events, by the partial index")
	require.Contains(t, reports[5], `"filter": {"feed": "hooks/0", "key": "k"}`, "then each key's head")
}

// TestMockPartitionGuardFollowsAChangedCount: the stored count is 4 when a
// producer that follows it first reads it; it has become 8 by the time
// the producer inserts, and the outbox's validator refuses the insert. The
// transaction runs again, with partitions computed by 8. A producer that
// asserts another count is refused before it writes anything, and so are
// feeds of another count or out of range.
func TestMockPartitionGuardFollowsAChangedCount(t *testing.T) {
	uri, lines := mockServerLines(t, "partitionguard")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	keys := []string{"order-1", "order-2", "order-3"}
	var evs []*ferryevent.Event
	for _, k := range keys {
		evs = append(evs, ferrydrivertest.Event("orders", k, ""))
	}
	require.NoError(t, drv.Append(ctx, evs))
	reports := awaitReports(ctx, t, lines, 2)
	for i, n := range []int{4, 8} {
		var r struct {
			Doc []struct {
				Key string `json:"key"`
				P   int    `json:"p"`
				PC  int    `json:"pc"`
			} `json:"doc"`
		}
		require.NoError(t, json.Unmarshal([]byte(reports[i]), &r), reports[i])
		require.Len(t, r.Doc, len(keys))
		for j, d := range r.Doc {
			require.Equal(t, keys[j], d.Key)
			require.Equal(t, n, d.PC, "insert %d carries the count it was computed with", i+1)
			require.Equal(t, ferrydriver.PartitionOf(d.Key, n), d.P)
		}
	}
	require.Equal(t, ferrydriver.PartitionOf("order-1", 8), drv.PartitionOf("order-1"))

	stale, err := ferrymongo.New(ctx, client, "app", &ferrymongo.Config{Partitions: 4})
	require.NoError(t, err)
	err = stale.Append(ctx, []*ferryevent.Event{ferrydrivertest.Event("orders", "order-1", "")})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured)
	require.ErrorContains(t, err, "Config.Partitions (--partitions / FERRY_PARTITIONS) is 4 but database app stores 8")
	_, err = stale.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "default/0"})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured)
	_, err = drv.OpenFeed(ctx, &ferrydriver.OpenFeedParams{Feed: "default/8", Partition: 8})
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured)
	require.ErrorContains(t, err, "out of range")
	select {
	case l := <-lines:
		t.Fatalf("a refused producer or feed sent: %s", l)
	case <-time.After(500 * time.Millisecond):
	}
}

// TestMockMigrateStoresThePartitionCount: Migrate with no count over an
// outbox whose checkpoints reach partition 2 and events partition 3 stores
// 4, only if no count is stored yet, and sets the outbox's validator to it.
func TestMockMigrateStoresThePartitionCount(t *testing.T) {
	uri, lines := mockServerLines(t, "migratepartitions")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	require.Equal(t, len(drv.Migrations()), res.Current)
	reports := awaitReports(ctx, t, lines, 2)
	require.Contains(t, reports[0], `"kind": "update"`)
	require.Contains(t, reports[0], `"$setOnInsert": {"n": 4}`)
	require.Contains(t, reports[0], `"upsert": true`)
	require.Contains(t, reports[1], `"kind": "validator"`)
	require.Contains(t, reports[1], `"validator": {"$or": [{"pc": {"$exists": false}}, {"pc": 4}]}`)
	n, err := drv.StoredPartitions(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n)
}

// TestMockSetPartitionsRefusesWhileARelayHoldsAFeed: the change holds
// producers back (the validator refuses every guarded event), finds a
// relay's lease (not the chain source's), refuses naming it and restores
// the validator; once no relay holds a feed and the outbox is empty, it
// stores the new count and sets the validator to it.
func TestMockSetPartitionsRefusesWhileARelayHoldsAFeed(t *testing.T) {
	uri, lines := mockServerLines(t, "setpartitions")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	_, err = drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 8})
	require.ErrorIs(t, err, ferrydriver.ErrPartitionChangeUnsafe)
	require.ErrorContains(t, err, "relay relay-1 holds lease default/0")
	require.ErrorContains(t, err, "members/default/host-1", "a ferry run process's membership counts too")
	require.NotContains(t, err.Error(), "chain/orders")
	reports := awaitReports(ctx, t, lines, 2)
	require.Contains(t, reports[0], `"validator": {"pc": {"$exists": false}}`, "producers are held back first")
	require.Contains(t, reports[1], `{"pc": 4}`, "and let go again")

	prev, err := drv.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: 8})
	require.NoError(t, err)
	require.Equal(t, 4, prev)
	reports = awaitReports(ctx, t, lines, 3)
	require.Contains(t, reports[0], `"validator": {"pc": {"$exists": false}}`)
	require.Contains(t, reports[1], `"$set": {"n": 8}`)
	require.Contains(t, reports[2], `{"pc": 8}`)
	n, err := drv.StoredPartitions(ctx)
	require.NoError(t, err)
	require.Equal(t, 8, n)
}

// TestMockPolicyChangeResumesItsSweep: a policy stored again while its
// sweep is pending (a change interrupted after key k0199) resumes the
// sweep after that key, in key order, a chunk at a time, and records it
// finished for its generation in the chunk's transaction; before, a call
// with the policy unchanged returned at once and left the keys past
// k0199 under the old policy.
func TestMockPolicyChangeResumesItsSweep(t *testing.T) {
	uri, lines := mockServerLines(t, "policysweep")
	client := mockClient(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
	require.NoError(t, drv.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: "g", HoldDead: true}))
	reports := awaitReports(ctx, t, lines, 4)
	require.Contains(t, reports[0], `"query": {"_id": "g"}`)
	require.Contains(t, reports[0], `"_changed"`, "a change is told from the same policy stored again")
	require.Contains(t, reports[0], `"new": true`, "the sweep as stored after the update")
	require.Contains(t, reports[1], `"filter": {"g": "g", "k": {"$gt": "k0199"}}`, "resumed after the last key swept")
	require.Contains(t, reports[1], `"sort": {"k": 1}`)
	require.Contains(t, reports[1], `"limit": 200`, "a chunk at a time")
	require.Contains(t, reports[1], `"startTransaction": true`)
	require.Contains(t, reports[2], `"sweep_gen": 3`, "progress of its own generation only")
	require.Contains(t, reports[2], `"sweeping": false`, "finished")
	require.Contains(t, reports[3], `"kind": "commit"`)
}
