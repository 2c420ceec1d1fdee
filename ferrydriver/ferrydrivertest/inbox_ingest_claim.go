package ferrydrivertest

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// IngestClaimDriver is an inbox that claims as it ingests
// (ferrydriver.InboxIngestClaimer).
type IngestClaimDriver[TTx any] interface {
	InboxDriver[TTx]
	ferrydriver.InboxIngestClaimer
}

// ExerciseInboxIngestClaims runs the tests of InsertInboxClaim, for a
// backend that implements ferrydriver.InboxIngestClaimer. newDriver
// returns a driver over a fresh, migrated, isolated namespace.
func ExerciseInboxIngestClaims[TTx any](t *testing.T, newDriver func(t *testing.T) IngestClaimDriver[TTx]) {
	for _, c := range []struct {
		name string
		run  func(*testing.T, IngestClaimDriver[TTx])
	}{
		{"ClaimsIdleKeys", testIngestClaimsIdleKeys[TTx]},
		{"KeepsToItsBounds", testIngestClaimKeepsToItsBounds[TTx]},
		{"LeavesBusyKeys", testIngestClaimLeavesBusyKeys[TTx]},
	} {
		t.Run(c.name, func(t *testing.T) { t.Parallel(); c.run(t, newDriver(t)) })
	}
}

// ingestClaim ingests events into group, claiming what keys and perKey
// allow, and returns InsertInbox's result, the claimed rows' event IDs
// and the rows (by key, then position).
func ingestClaim[TTx any](t *testing.T, d IngestClaimDriver[TTx], keys, perKey int, events ...*ferryevent.Event) ([]bool, []uuid.UUID, []*ferrydriver.InboxRow) {
	t.Helper()
	inserted, rows, err := d.InsertInboxClaim(context.Background(), &ferrydriver.InsertInboxParams{Group: group, Events: events},
		&ferrydriver.IngestClaimParams{Worker: "w", TTL: time.Minute, Keys: keys, PerKey: perKey})
	require.NoError(t, err)
	for _, r := range rows {
		require.Equal(t, ferrydriver.InboxProcessing, r.State)
		require.Equal(t, 1, r.Attempts)
		require.NotEmpty(t, r.Claim)
	}
	return inserted, eventIDs(rows), rows
}

// claimRuns claims like a consumer of one event per transaction: runs of
// up to 32 rows of up to 32 keys.
func claimRuns[TTx any](t *testing.T, d InboxDriver[TTx]) []uuid.UUID {
	t.Helper()
	rows, err := d.ClaimInbox(context.Background(), &ferrydriver.ClaimInboxParams{Group: group, Worker: "w", Limit: 32, PerKey: 32, Keys: 32,
		TTL: time.Minute, MaxAttempts: 10})
	require.NoError(t, err)
	return eventIDs(rows)
}

// completeRuns completes claimed rows (by key, then position), each key's
// run in order, keeping the claim on the run's later rows.
func completeRuns[TTx any](t *testing.T, d InboxDriver[TTx], rows []*ferrydriver.InboxRow) {
	t.Helper()
	for i, r := range rows {
		keep := i+1 < len(rows) && rows[i+1].Event.Key == r.Event.Key
		require.NoError(t, d.RunInTx(context.Background(), func(ctx context.Context, tx TTx) error {
			return d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: r.Event.ID, Claim: r.Claim, Keep: keep})
		}))
	}
}

func eventIDs(rows []*ferrydriver.InboxRow) []uuid.UUID {
	ids := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		ids[i] = r.Event.ID
	}
	return ids
}

func keyEvent(key string) *ferryevent.Event {
	return &ferryevent.Event{ID: uuid.Must(uuid.NewV7()), Topic: "t", Key: key, Type: "T", Payload: []byte(`{"k":"` + key + `"}`), CreatedAt: time.Now()}
}

// An ingest claims the new rows of keys that had nothing to do, new keys
// and keys whose rows all finished alike: their claims hold like a
// claim's, nothing else claims them meanwhile, and their finish leaves the
// keys idle again.
func testIngestClaimsIdleKeys[TTx any](t *testing.T, d IngestClaimDriver[TTx]) {
	ctx := context.Background()
	a1, a2, b1 := keyEvent("a"), keyEvent("a"), keyEvent("b")
	inserted, ids, rows := ingestClaim(t, d, 8, 32, b1, a1, a2)
	require.Equal(t, []bool{true, true, true}, inserted)
	require.Equal(t, []uuid.UUID{a1.ID, a2.ID, b1.ID}, ids, "by key, then position")
	require.Equal(t, b1.Payload, rows[2].Event.Payload)
	require.Empty(t, claimRuns(t, d), "claimed keys are not claimed again")
	completeRuns(t, d, rows)

	// a is idle again (its rows finished): a new row of it is claimed; a
	// duplicate is neither inserted nor claimed.
	a3 := keyEvent("a")
	inserted, ids, rows = ingestClaim(t, d, 8, 32, a3, a1)
	require.Equal(t, []bool{true, false}, inserted)
	require.Equal(t, []uuid.UUID{a3.ID}, ids)
	completeRuns(t, d, rows)
	st, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{a1.ID, a2.ID, a3.ID, b1.ID}})
	require.NoError(t, err)
	for _, id := range []uuid.UUID{a1.ID, a2.ID, a3.ID, b1.ID} {
		require.Equal(t, ferrydriver.InboxProcessed, st[id].State)
	}
	require.Empty(t, claimRuns(t, d))
}

// Keys bounds the keys claimed (in key order), PerKey each key's rows:
// what is not claimed runs through ordinary claims, in order, the key's
// rows after its claim once the claim finishes.
func testIngestClaimKeepsToItsBounds[TTx any](t *testing.T, d IngestClaimDriver[TTx]) {
	a1, a2, a3, b1 := keyEvent("a"), keyEvent("a"), keyEvent("a"), keyEvent("b")
	_, ids, rows := ingestClaim(t, d, 1, 2, a1, a2, a3, b1)
	require.Equal(t, []uuid.UUID{a1.ID, a2.ID}, ids, "one key, two rows")
	require.Equal(t, []uuid.UUID{b1.ID}, claimRuns(t, d), "b is runnable; a is claimed")
	completeRuns(t, d, rows)
	require.Equal(t, []uuid.UUID{a3.ID}, claimRuns(t, d), "a's third row runs after its claim")

	_, ids, _ = ingestClaim(t, d, 0, 32, keyEvent("c"))
	require.Empty(t, ids, "Keys 0 claims nothing")
}

// A key with something to do keeps it in order: an ingest does not claim
// a key that is runnable (rows waiting), claimed, or held by a DEAD row.
func testIngestClaimLeavesBusyKeys[TTx any](t *testing.T, d IngestClaimDriver[TTx]) {
	ctx := context.Background()
	require.NoError(t, d.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: group, HoldDead: true}))
	waiting, claimed, dead := keyEvent("waiting"), keyEvent("claimed"), keyEvent("dead")
	insert(ctx, t, d, waiting)
	_, ids, rows := ingestClaim(t, d, 8, 32, claimed, dead)
	require.Equal(t, []uuid.UUID{claimed.ID, dead.ID}, ids)
	require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: dead.ID, Claim: rows[1].Claim, Error: "bad", Dead: true}))

	w2, c2, d2 := keyEvent("waiting"), keyEvent("claimed"), keyEvent("dead")
	inserted, ids, _ := ingestClaim(t, d, 8, 32, w2, c2, d2)
	require.Equal(t, []bool{true, true, true}, inserted)
	require.Empty(t, ids)
	require.Equal(t, []uuid.UUID{waiting.ID, w2.ID}, claimRuns(t, d), "the waiting key's rows run in order, by a claim")
	completeRuns(t, d, rows[:1]) // claimed's first row, the claim's last
	require.Equal(t, []uuid.UUID{c2.ID}, claimRuns(t, d), "the claimed key's new row runs after its claim")
}
