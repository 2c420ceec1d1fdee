package ferrydrivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryevent/ferryeventtest"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// InboxDriver is a backend with consumer inboxes.
type InboxDriver[TTx any] interface {
	ferrydriver.Store
	ferrydriver.Inbox[TTx]
}

// RunsClaimedRowsAgain checks an upgrade of a database whose consumer
// stopped with first claimed under the old schema (its attempt counted)
// and second queued behind it on the same key: claimed one at a time,
// first comes again, PROCESSING with its old attempt counted and the new
// one, then second; each completes.
func RunsClaimedRowsAgain[TTx any](ctx context.Context, t *testing.T, drv InboxDriver[TTx], group string, first, second *ferryevent.Event) {
	t.Helper()
	for _, want := range []*ferryevent.Event{first, second} {
		rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "w", Limit: 1, TTL: time.Minute})
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, want.ID, rows[0].Event.ID)
		require.Equal(t, ferrydriver.InboxProcessing, rows[0].State)
		if want == first {
			require.Equal(t, 2, rows[0].Attempts, "the attempt of the old claim stays counted")
		}
		require.NoError(t, drv.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
			return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: want.ID, Claim: rows[0].Claim})
		}))
	}
}

// ExerciseInbox runs the inbox part of the suite. newDriver returns a
// driver over a fresh, migrated, isolated namespace.
func ExerciseInbox[TTx any](t *testing.T, newDriver func(t *testing.T) InboxDriver[TTx]) {
	for _, c := range inboxCases[TTx]() {
		t.Run(c.name, func(t *testing.T) { t.Parallel(); c.run(t, newDriver(t)) })
	}
}

// ExerciseInboxCases runs the named tests of the inbox part of the suite
// (as ExerciseInbox names them), for a server that cannot run them all in
// reasonable time (ferrymongo's fake server). An unknown name fails.
func ExerciseInboxCases[TTx any](t *testing.T, newDriver func(t *testing.T) InboxDriver[TTx], names ...string) {
	cases := map[string]func(*testing.T, InboxDriver[TTx]){}
	for _, c := range inboxCases[TTx]() {
		cases[c.name] = c.run
	}
	for _, name := range names {
		run, ok := cases[name]
		require.True(t, ok, "no inbox test named %q", name)
		t.Run(name, func(t *testing.T) { t.Parallel(); run(t, newDriver(t)) })
	}
}

type inboxCase[TTx any] struct {
	name string
	run  func(*testing.T, InboxDriver[TTx])
}

func inboxCases[TTx any]() []inboxCase[TTx] {
	return []inboxCase[TTx]{
		{"InsertAbsorbsDuplicates", testInboxDedup[TTx]},
		{"EdgeCaseEventsArriveExactly", testInboxEdgeCases[TTx]},
		{"ClaimsHeadsInKeyOrder", testInboxHeads[TTx]},
		{"CompleteCommitsWithHandlerTx", testInboxComplete[TTx]},
		{"ExpiredClaimIsReclaimed", testInboxExpiredClaim[TTx]},
		{"ReapedClaimIsRescued", testInboxReapedClaim[TTx]},
		{"ExpiredRunsAreRescuedKeyByKey", testInboxExpiredRuns[TTx]},
		{"StaleAttemptCannotFinishALaterClaim", testInboxStaleAttempt[TTx]},
		{"ExhaustedAttemptsGoDeadAtClaim", testInboxExhausted[TTx]},
		{"UncountedFailureTakesTheAttemptBack", testInboxUncounted[TTx]},
		{"FailedRetriesWhenDue", testInboxRetry[TTx]},
		{"DeadHoldsOrContinues", testInboxDead[TTx]},
		{"ConcurrentWorkersKeepKeyOrder", testInboxConcurrent[TTx]},
		{"DeadLettersListRedriveDiscard", testInboxDeadLetters[TTx]},
		{"RetentionOfProcessed", testInboxRetention[TTx]},
		{"DeadRowsPageByCursor", testInboxPages[TTx]},
		{"AwaitSettled", testAwaitSettled[TTx]},
		{"PolicyChangesAndContinueRedrive", testInboxPolicy[TTx]},
		{"InterruptedPolicyChangeResumes", testInboxPolicyResume[TTx]},
		{"ConformsToTheModel", testInboxModel[TTx]},
		{"AttemptHistory", testInboxAttempts[TTx]},
		{"Retract", testInboxRetract[TTx]},
	}
}

const group = "g"

func claim[TTx any](ctx context.Context, t *testing.T, d InboxDriver[TTx], worker string) []*ferrydriver.InboxRow {
	t.Helper()
	rows, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: worker, Limit: 100, TTL: time.Minute})
	require.NoError(t, err)
	return rows
}

// rescue claims rows whose claim expired.
func rescue[TTx any](ctx context.Context, t *testing.T, d InboxDriver[TTx], worker string) []*ferrydriver.InboxRow {
	t.Helper()
	rows, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: worker, Limit: 100, TTL: time.Minute, Rescue: true})
	require.NoError(t, err)
	return rows
}

func complete[TTx any](ctx context.Context, t *testing.T, d InboxDriver[TTx], row *ferrydriver.InboxRow) {
	t.Helper()
	require.NoError(t, d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
		return d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: row.Event.ID, Claim: row.Claim})
	}))
}

func payloads(rows []*ferrydriver.InboxRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = string(r.Event.Payload)
	}
	return out
}

func insert[TTx any](ctx context.Context, t *testing.T, d InboxDriver[TTx], evs ...*ferryevent.Event) {
	t.Helper()
	_, err := d.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: group, Events: evs})
	require.NoError(t, err)
}

func testInboxDedup[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	var evs []*ferryevent.Event
	for i := range 50 {
		evs = append(evs, Event("t", "k"+strconv.Itoa(i%5), strconv.Itoa(i)))
	}
	var wg sync.WaitGroup
	inserted := make([][]bool, 3)
	for c := range 3 {
		wg.Go(func() {
			res, err := d.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: group, Events: evs})
			if err != nil {
				t.Error(err)
				return
			}
			inserted[c] = res
		})
	}
	wg.Wait()
	for i := range evs {
		n := 0
		for c := range 3 {
			if inserted[c][i] {
				n++
			}
		}
		require.Equal(t, 1, n, "event %d inserted by exactly one of three concurrent deliveries", i)
	}
	// Another group records the same events separately.
	res, err := d.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "other", Events: evs[:3]})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, true}, res)
}

// testInboxEdgeCases: every edge-case event Emit accepts is claimed from
// the inbox, and so handed to its handler, exactly as it was delivered
// (ferryeventtest).
func testInboxEdgeCases[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	accepted := ferryeventtest.Prepare(t, ferryeventtest.Cases(0), 0)
	insert(ctx, t, d, accepted...)
	rows := claim(ctx, t, d, "w1")
	require.Len(t, rows, len(accepted), "every event has a key of its own: all are heads")
	byID := make(map[uuid.UUID]*ferryevent.Event, len(rows))
	for _, r := range rows {
		byID[r.Event.ID] = &r.Event
	}
	for _, want := range accepted {
		ferryeventtest.RequireSame(t, want, byID[want.ID])
	}
}

func testInboxHeads[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	insert(ctx, t, d, Event("t", "a", "a1"), Event("t", "a", "a2"), Event("t", "b", "b1"))
	insert(ctx, t, d, Event("t", "a", "a3"))
	rows := claim(ctx, t, d, "w1")
	require.ElementsMatch(t, []string{"a1", "b1"}, payloads(rows), "one head per key")
	require.Empty(t, claim(ctx, t, d, "w2"), "heads being processed block their keys")
	for _, r := range rows {
		require.Equal(t, ferrydriver.InboxProcessing, r.State)
		require.Equal(t, 1, r.Attempts)
		if string(r.Event.Payload) == "a1" {
			complete(ctx, t, d, r)
		}
	}
	require.Equal(t, []string{"a2"}, payloads(claim(ctx, t, d, "w2")))
}

func testInboxComplete[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	insert(ctx, t, d, Event("t", "k", "one"), Event("t", "k", "two"))
	row := claim(ctx, t, d, "w1")[0]
	// The handler fails after marking: everything rolls back.
	boom := errors.New("handler failed")
	err := d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
		if err := d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: row.Event.ID, Claim: row.Claim}); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Empty(t, claim(ctx, t, d, "w2"), "the rolled-back completion left the row with w1")
	// Another claim token (another attempt's, or none) cannot complete it.
	for _, other := range []string{uuid.NewString(), ""} {
		err = d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
			return d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: row.Event.ID, Claim: other})
		})
		require.ErrorIs(t, err, ferrydriver.ErrClaimLost)
	}
	complete(ctx, t, d, row)
	err = d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
		return d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: row.Event.ID, Claim: row.Claim})
	})
	require.ErrorIs(t, err, ferrydriver.ErrClaimLost, "a row completes once")
	require.Equal(t, []string{"two"}, payloads(claim(ctx, t, d, "w2")))
}

func testInboxExpiredClaim[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	insert(ctx, t, d, Event("t", "k", "one"))
	rows, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "dies", Limit: 10, TTL: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	due, err := d.RescueDue(ctx, group)
	require.NoError(t, err)
	require.False(t, due, "the claim has not expired yet")
	require.Empty(t, rescue(ctx, t, d, "w2"))
	var again []*ferrydriver.InboxRow
	require.Eventually(t, func() bool {
		due, err := d.RescueDue(ctx, group)
		require.NoError(t, err)
		return due
	}, 10*time.Second, 20*time.Millisecond, "the expired claim is due for rescue")
	require.Empty(t, claim(ctx, t, d, "w2"), "an ordinary claim leaves an expired claim to a rescue")
	again = rescue(ctx, t, d, "w2")
	require.Len(t, again, 1, "a crashed worker's row is rescued once its claim expires")
	require.Equal(t, 2, again[0].Attempts)
	due, err = d.RescueDue(ctx, group)
	require.NoError(t, err)
	require.False(t, due, "rescued")
	err = d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
		return d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: rows[0].Event.ID, Claim: rows[0].Claim})
	})
	require.ErrorIs(t, err, ferrydriver.ErrClaimLost, "the first worker's late completion is fenced off")
	complete(ctx, t, d, again[0])
}

// testInboxExpiredRuns: runs whose claim expired (their worker crashed)
// are rescued a head at a time, and a rescue with room for N keys takes N
// keys, however long their runs; once a rescued head failed (a retry
// later, or DEAD holding the key), no rescue is due for its key until
// the head may run again, though the rest of its run is still under the
// expired claim: a rescue then would find nothing to take, and a consumer
// would pause its workers every second for it.
func testInboxExpiredRuns[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	for _, k := range []string{"a", "b", "c"} {
		insert(ctx, t, d, Event("t", k, k+"1"), Event("t", k, k+"2"), Event("t", k, k+"3"))
	}
	rows, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "dies", Limit: 100, PerKey: 3, TTL: 200 * time.Millisecond})
	require.NoError(t, err)
	claimed := time.Now()
	require.Len(t, rows, 9, "a run of three rows of each key")
	require.Eventually(t, func() bool {
		due, err := d.RescueDue(ctx, group)
		require.NoError(t, err)
		return due
	}, 10*time.Second, 20*time.Millisecond, "the expired runs are due for rescue")
	// A backend that claims key by key (MongoDB) gave each key's run an
	// expiry of its own: past the last one, all three keys are due.
	time.Sleep(time.Until(claimed.Add(200 * time.Millisecond)))
	heads, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "w2", Limit: 2, PerKey: 3, TTL: time.Minute, Rescue: true})
	require.NoError(t, err)
	require.Len(t, heads, 2, "a rescue with room for two keys takes two heads, one of each key")
	require.NotEqual(t, heads[0].Event.Key, heads[1].Event.Key)
	for _, h := range heads {
		require.Equal(t, h.Event.Key+"1", string(h.Event.Payload), "the head of its key")
	}
	// One head fails with a retry an hour away, the other goes DEAD and
	// holds its key: neither key is due for a rescue.
	require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: heads[0].Event.ID, Claim: heads[0].Claim,
		Error: "later", RetryAt: time.Now().Add(time.Hour)}))
	require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: heads[1].Event.ID, Claim: heads[1].Claim,
		Error: "poison", Dead: true}))
	last := rescue(ctx, t, d, "w3")
	require.Len(t, last, 1, "the third key's head")
	complete(ctx, t, d, last[0])
	// The third key's next row is left to a rescue of its own.
	next := rescue(ctx, t, d, "w3")
	require.Len(t, next, 1)
	require.Equal(t, last[0].Event.Key+"2", string(next[0].Event.Payload))
	complete(ctx, t, d, next[0])
	next = rescue(ctx, t, d, "w3")
	require.Len(t, next, 1)
	complete(ctx, t, d, next[0])
	due, err := d.RescueDue(ctx, group)
	require.NoError(t, err)
	require.False(t, due, "the other two keys wait for their heads: a retry an hour away, a DEAD row holding")
	require.Empty(t, rescue(ctx, t, d, "w4"))
	require.Empty(t, claim(ctx, t, d, "w4"))
}

// testInboxReapedClaim: a worker's claims ended by ExpireClaims (its
// membership lapsed) are rescued at once, long before their TTL, and its
// late completion is refused; another worker's claims are left alone.
func testInboxReapedClaim[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	insert(ctx, t, d, Event("t", "k1", "one"), Event("t", "k2", "two"))
	dead, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "dies", Limit: 1, TTL: time.Hour})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	live, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "lives", Limit: 1, TTL: time.Hour})
	require.NoError(t, err)
	require.Len(t, live, 1)
	holders, err := d.ClaimHolders(ctx, group)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"dies", "lives"}, holders)
	n, err := d.ExpireClaims(ctx, &ferrydriver.ExpireClaimsParams{Group: group, Worker: "dies"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = d.ExpireClaims(ctx, &ferrydriver.ExpireClaimsParams{Group: group, Worker: "dies"})
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to end")
	holders, err = d.ClaimHolders(ctx, group)
	require.NoError(t, err)
	require.Equal(t, []string{"lives"}, holders)
	due, err := d.RescueDue(ctx, group)
	require.NoError(t, err)
	require.True(t, due, "the ended claim is due for rescue at once")
	again := rescue(ctx, t, d, "w2")
	require.Len(t, again, 1)
	require.Equal(t, dead[0].Event.ID, again[0].Event.ID)
	require.Equal(t, 2, again[0].Attempts, "the ended claim counted its attempt")
	err = d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
		return d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: dead[0].Event.ID, Claim: dead[0].Claim})
	})
	require.ErrorIs(t, err, ferrydriver.ErrClaimLost, "the reaped worker's late completion is fenced off")
	complete(ctx, t, d, again[0])
	complete(ctx, t, d, live[0])
}

// testInboxStaleAttempt: one worker's attempt outlives its claim, the
// same worker claims the row again, and the first attempt's late failure
// (or completion) must not touch the second claim.
func testInboxStaleAttempt[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	insert(ctx, t, d, Event("t", "k", "slow"))
	first, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "w", Limit: 10, TTL: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, first, 1)
	var second []*ferrydriver.InboxRow
	require.Eventually(t, func() bool {
		second = rescue(ctx, t, d, "w") // the same worker ID
		return len(second) == 1
	}, 10*time.Second, 20*time.Millisecond)
	require.NotEqual(t, first[0].Claim, second[0].Claim, "every claim has a token of its own")
	require.Equal(t, 2, second[0].Attempts)

	err = d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: first[0].Event.ID, Claim: first[0].Claim, Error: "late", Dead: true})
	require.ErrorIs(t, err, ferrydriver.ErrClaimLost, "the stale attempt's failure is fenced off")
	err = d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
		return d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: first[0].Event.ID, Claim: first[0].Claim})
	})
	require.ErrorIs(t, err, ferrydriver.ErrClaimLost, "and so is its completion")
	complete(ctx, t, d, second[0])
	st, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{first[0].Event.ID}})
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessed, st[first[0].Event.ID].State)
	require.Equal(t, 2, st[first[0].Event.ID].Attempts)
}

// testInboxExhausted: a row whose attempts all lost their claim (the
// worker crashed each time) goes DEAD at the next claim instead of running
// again, and its key follows the policy.
func testInboxExhausted[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	// Continue first: it leaves no key held when the policy becomes Hold.
	for _, hold := range []bool{false, true} {
		require.NoError(t, d.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: group, HoldDead: hold}))
		key := fmt.Sprintf("k-%v", hold)
		poison, next := Event("t", key, "poison-"+key), Event("t", key, "next-"+key)
		insert(ctx, t, d, poison, next)
		claimOnce := func() []*ferrydriver.InboxRow {
			// What a consumer does: an ordinary claim, then a rescue.
			rows, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "crashes", Limit: 10, TTL: 150 * time.Millisecond, MaxAttempts: 2})
			require.NoError(t, err)
			if len(rows) > 0 {
				return rows
			}
			rows, err = d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "crashes", Limit: 10, TTL: 150 * time.Millisecond, MaxAttempts: 2, Rescue: true})
			require.NoError(t, err)
			return rows
		}
		var got []*ferrydriver.InboxRow
		for attempt := 1; attempt <= 2; attempt++ {
			require.Eventually(t, func() bool { got = claimOnce(); return len(got) == 1 }, 10*time.Second, 20*time.Millisecond)
			require.Equal(t, ferrydriver.InboxProcessing, got[0].State)
			require.Equal(t, attempt, got[0].Attempts)
			// ... and the worker dies: nothing is recorded.
		}
		require.Eventually(t, func() bool { got = claimOnce(); return len(got) == 1 }, 10*time.Second, 20*time.Millisecond)
		require.Equal(t, poison.ID, got[0].Event.ID)
		require.Equal(t, ferrydriver.InboxDead, got[0].State, "attempts exhausted: not claimed again")
		require.Equal(t, 2, got[0].Attempts, "no attempt beyond MaxAttempts")
		require.Empty(t, got[0].Claim)
		require.Contains(t, got[0].LastError, ferrydriver.ReasonAttemptsExhausted)
		st, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{poison.ID}})
		require.NoError(t, err)
		require.Equal(t, ferrydriver.InboxDead, st[poison.ID].State)
		require.False(t, st[poison.ID].FinishedAt.IsZero())
		if hold {
			time.Sleep(300 * time.Millisecond)
			require.Empty(t, claimOnce(), "Hold: the dead row keeps its key's later rows back")
		} else {
			require.Eventually(t, func() bool { got = claimOnce(); return len(got) == 1 }, 10*time.Second, 20*time.Millisecond, "Continue: the key moves on")
			require.Equal(t, next.ID, got[0].Event.ID)
			require.Equal(t, 1, got[0].Attempts)
			complete(ctx, t, d, got[0])
		}
	}
}

// testInboxUncounted: an attempt whose handler never ran (its transaction
// could not begin) is given back without counting.
func testInboxUncounted[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	insert(ctx, t, d, Event("t", "k", "one"))
	row := claim(ctx, t, d, "w")[0]
	require.Equal(t, 1, row.Attempts)
	require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: row.Event.ID, Claim: row.Claim,
		Error: "begin: pool exhausted", RetryAt: time.Now(), Uncounted: true}))
	var again []*ferrydriver.InboxRow
	require.Eventually(t, func() bool { again = claim(ctx, t, d, "w"); return len(again) == 1 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, again[0].Attempts, "the attempt that never ran does not count")
	complete(ctx, t, d, again[0])
}

func testInboxRetry[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	insert(ctx, t, d, Event("t", "k", "flaky"), Event("t", "k", "after"))
	row := claim(ctx, t, d, "w")[0]
	require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: row.Event.ID, Claim: row.Claim, Error: "timeout", RetryAt: time.Now().Add(300 * time.Millisecond)}))
	require.Empty(t, claim(ctx, t, d, "w"), "a failed head waits for its next attempt, and so does its key")
	var again []*ferrydriver.InboxRow
	require.Eventually(t, func() bool {
		again = claim(ctx, t, d, "w")
		return len(again) > 0
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{"flaky"}, payloads(again))
	require.Equal(t, 2, again[0].Attempts)
	require.Equal(t, "timeout", again[0].LastError)
}

func testInboxDead[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	// Continue first: it leaves no key held when the policy becomes Hold.
	for _, hold := range []bool{false, true} {
		require.NoError(t, d.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: group, HoldDead: hold}))
		key := fmt.Sprintf("k-%v", hold)
		insert(ctx, t, d, Event("t", key, "poison"), Event("t", key, "next"), Event("t", "other-"+key, "free"))
		rows := claim(ctx, t, d, "w")
		require.ElementsMatch(t, []string{"poison", "free"}, payloads(rows))
		for _, r := range rows {
			if string(r.Event.Payload) == "poison" {
				require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: r.Event.ID, Claim: r.Claim, Error: "bad", Dead: true}))
			} else {
				complete(ctx, t, d, r)
			}
		}
		next := claim(ctx, t, d, "w")
		if hold {
			require.Empty(t, next, "Hold: the dead row keeps its key's later rows back")
		} else {
			require.Equal(t, []string{"next"}, payloads(next), "Continue: the key moves on")
			complete(ctx, t, d, next[0])
		}
	}
}

func testInboxConcurrent[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	const keys, perKey, workers = 20, 15, 4
	var evs []*ferryevent.Event
	for i := range keys * perKey {
		evs = append(evs, Event("t", "k"+strconv.Itoa(i%keys), strconv.Itoa(i/keys)))
	}
	// Ingest in slices while the workers run, as a source would.
	go func() {
		for i := 0; i < len(evs); i += 25 {
			if _, err := d.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: group, Events: evs[i:min(i+25, len(evs))]}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var mu sync.Mutex
	done := map[string][]string{}
	total := 0
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			worker := "w" + strconv.Itoa(w)
			for ctx.Err() == nil {
				mu.Lock()
				finished := total == len(evs)
				mu.Unlock()
				if finished {
					return
				}
				rows, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: worker, Limit: 3, TTL: time.Minute})
				if err != nil {
					t.Error(err)
					return
				}
				for _, r := range rows {
					recorded := false
					err := d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
						if err := d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: r.Event.ID, Claim: r.Claim}); err != nil {
							return err
						}
						// Recorded before the commit: the key's next row can
						// only be claimed after it, so the record's order is
						// the order the rows ran in (recording after RunInTx
						// returned could be overtaken by the next row's worker).
						// Once per event: a backend may find a conflict at
						// the commit, and RunInTx runs this again.
						if !recorded {
							recorded = true
							mu.Lock()
							done[r.Event.Key] = append(done[r.Event.Key], string(r.Event.Payload))
							total++
							mu.Unlock()
						}
						return nil
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
				if len(rows) == 0 {
					time.Sleep(2 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, len(evs), total)
	for k, got := range done {
		want := make([]string, perKey)
		for i := range want {
			want[i] = strconv.Itoa(i)
		}
		require.Equal(t, want, got, "key %s ran out of order", k)
	}
}

// kill claims runnable heads, failing for good those whose payload is in
// want and completing the others.
func kill[TTx any](ctx context.Context, t *testing.T, d InboxDriver[TTx], want ...string) {
	t.Helper()
	for _, r := range claim(ctx, t, d, "w") {
		if slices.Contains(want, string(r.Event.Payload)) {
			require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: r.Event.ID, Claim: r.Claim, Error: "bad " + string(r.Event.Payload), Dead: true}))
		} else {
			complete(ctx, t, d, r)
		}
	}
}
