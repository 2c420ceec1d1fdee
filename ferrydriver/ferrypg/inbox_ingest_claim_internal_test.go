package ferrypg

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// ingestClaim ingests events, claiming what keys and perKey allow, and
// returns the claimed rows' event IDs (key, then position order).
func ingestClaim(t *testing.T, drv *Driver[pgx.Tx], group string, keys, perKey int, events ...*ferryevent.Event) ([]bool, []uuid.UUID, []*ferrydriver.InboxRow) {
	t.Helper()
	inserted, rows, err := drv.InsertInboxClaim(context.Background(), &ferrydriver.InsertInboxParams{Group: group, Events: events},
		&ferrydriver.IngestClaimParams{Worker: "w", TTL: time.Minute, Keys: keys, PerKey: perKey})
	require.NoError(t, err)
	for _, r := range rows {
		require.Equal(t, ferrydriver.InboxProcessing, r.State)
		require.Equal(t, 1, r.Attempts)
		require.NotEmpty(t, r.Claim)
	}
	return inserted, claimedIDs(rows), rows
}

// completeAll completes claimed rows (by key, then position), each key's
// run in order, keeping the claim on the run's later rows.
func completeAll(t *testing.T, drv *Driver[pgx.Tx], group string, rows []*ferrydriver.InboxRow) {
	t.Helper()
	for i, r := range rows {
		keep := i+1 < len(rows) && rows[i+1].Event.Key == r.Event.Key
		require.NoError(t, raceComplete(drv, group, r, keep))
	}
}

func claimedIDs(rows []*ferrydriver.InboxRow) []uuid.UUID {
	ids := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		ids[i] = r.Event.ID
	}
	return ids
}

// An ingest claims the new rows of keys that had nothing to do, new keys
// and keys whose rows all finished alike: their claims hold like a
// claim's, nothing else claims them meanwhile, and their finish leaves the
// keys idle again.
func TestInboxIngestClaimsIdleKeys(t *testing.T) {
	ctx := context.Background()
	drv := newTestDriver(t)
	const g = "g"
	a1, a2, b1 := raceEvent("a"), raceEvent("a"), raceEvent("b")
	inserted, ids, rows := ingestClaim(t, drv, g, 8, 32, b1, a1, a2)
	require.Equal(t, []bool{true, true, true}, inserted)
	require.Equal(t, []uuid.UUID{a1.ID, a2.ID, b1.ID}, ids, "by key, then position")
	require.Equal(t, b1.Payload, rows[2].Event.Payload)
	require.Empty(t, raceClaim(t, drv, g), "claimed keys are not claimed again")
	completeAll(t, drv, g, rows)

	// a is idle again (its rows finished): a new row of it is claimed; a
	// duplicate is neither inserted nor claimed.
	a3 := raceEvent("a")
	inserted, ids, rows = ingestClaim(t, drv, g, 8, 32, a3, a1)
	require.Equal(t, []bool{true, false}, inserted)
	require.Equal(t, []uuid.UUID{a3.ID}, ids)
	completeAll(t, drv, g, rows)
	st, err := drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: g, EventIDs: []uuid.UUID{a1.ID, a2.ID, a3.ID, b1.ID}})
	require.NoError(t, err)
	for _, id := range []uuid.UUID{a1.ID, a2.ID, a3.ID, b1.ID} {
		require.Equal(t, ferrydriver.InboxProcessed, st[id].State)
	}
	require.Empty(t, raceClaim(t, drv, g))
}

// Keys bounds the keys claimed (in key order), PerKey each key's rows:
// what is not claimed runs through ordinary claims, in order, the key's
// rows after its claim once the claim finishes.
func TestInboxIngestClaimKeepsToItsBounds(t *testing.T) {
	drv := newTestDriver(t)
	const g = "g"
	a1, a2, a3, b1 := raceEvent("a"), raceEvent("a"), raceEvent("a"), raceEvent("b")
	_, ids, rows := ingestClaim(t, drv, g, 1, 2, a1, a2, a3, b1)
	require.Equal(t, []uuid.UUID{a1.ID, a2.ID}, ids, "one key, two rows")
	require.Equal(t, []uuid.UUID{b1.ID}, claimedIDs(raceClaim(t, drv, g)), "b is runnable; a is claimed")
	completeAll(t, drv, g, rows)
	require.Equal(t, []uuid.UUID{a3.ID}, claimedIDs(raceClaim(t, drv, g)), "a's third row runs after its claim")

	_, ids, _ = ingestClaim(t, drv, g, 0, 32, raceEvent("c"))
	require.Empty(t, ids, "Keys 0 claims nothing")
}

// A key with something to do keeps it in order: an ingest does not claim
// a key that is runnable (rows waiting), claimed, or held by a DEAD row.
func TestInboxIngestClaimLeavesBusyKeys(t *testing.T) {
	ctx := context.Background()
	drv := newTestDriver(t)
	const g = "g"
	require.NoError(t, drv.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: g, HoldDead: true}))
	waiting, claimed, dead := raceEvent("waiting"), raceEvent("claimed"), raceEvent("dead")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{waiting}})
	require.NoError(t, err)
	_, ids, rows := ingestClaim(t, drv, g, 8, 32, claimed, dead)
	require.Equal(t, []uuid.UUID{claimed.ID, dead.ID}, ids)
	require.NoError(t, drv.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: g, EventID: dead.ID, Claim: rows[1].Claim, Error: "bad", Dead: true}))

	w2, c2, d2 := raceEvent("waiting"), raceEvent("claimed"), raceEvent("dead")
	inserted, ids, _ := ingestClaim(t, drv, g, 8, 32, w2, c2, d2)
	require.Equal(t, []bool{true, true, true}, inserted)
	require.Empty(t, ids)
	require.Equal(t, []uuid.UUID{waiting.ID, w2.ID}, claimedIDs(raceClaim(t, drv, g)), "the waiting key's rows run in order, by a claim")
	require.NoError(t, raceComplete(drv, g, rows[0], false)) // claimed's first row
	require.Equal(t, []uuid.UUID{c2.ID}, claimedIDs(raceClaim(t, drv, g)), "the claimed key's new row runs after its claim")
}
