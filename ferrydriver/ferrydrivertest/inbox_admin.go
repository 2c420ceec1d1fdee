package ferrydrivertest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// testInboxRetract: retracting unfinished, running, processed and absent
// events, and again.
func testInboxRetract[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	a1, a2, a3 := Event("t", "a", "a1"), Event("t", "a", "a2"), Event("t", "a", "a3")
	b1, b2 := Event("t", "b", "b1"), Event("t", "b", "b2")
	insert(ctx, t, d, a1, a2, a3, b1, b2)
	// a1 is processed, b1 is running.
	rows := claim(ctx, t, d, "w1")
	require.ElementsMatch(t, []string{"a1", "b1"}, payloads(rows))
	for _, row := range rows {
		if row.Event.ID == a1.ID {
			complete(ctx, t, d, row)
		}
	}
	ghost := Event("t", "c", "c1") // never delivered
	comp := func(ev *ferryevent.Event) *ferryevent.Event {
		c := Event("t", ev.Key, "undo-"+string(ev.Payload))
		return c
	}
	compA1 := comp(a1)
	retractions := []ferrydriver.Retraction{
		{Event: a1, Compensation: compA1}, {Event: a2, Compensation: comp(a2)}, {Event: b1, Compensation: comp(b1)},
		{Event: ghost, Compensation: comp(ghost)},
	}
	res, err := d.RetractInbox(ctx, &ferrydriver.RetractInboxParams{Group: group, Retractions: retractions})
	require.NoError(t, err)
	require.Equal(t, []ferrydriver.InboxState{ferrydriver.InboxProcessed, ferrydriver.InboxPending, ferrydriver.InboxProcessing, ""}, res)

	// The running b1 cannot complete: its claim is gone.
	for _, row := range rows {
		if row.Event.ID == b1.ID {
			err := d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
				return d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: b1.ID, Claim: row.Claim})
			})
			require.ErrorIs(t, err, ferrydriver.ErrClaimLost, "a retracted row's handler must roll back")
		}
	}
	// What runs now: key a's next unretracted row (a3) comes before a1's
	// compensation, inserted at the end of the key; key b goes on with b2;
	// a2 and the ghost never run.
	var ran []string
	for range 10 {
		next := claim(ctx, t, d, "w2")
		if len(next) == 0 {
			break
		}
		for _, row := range next {
			ran = append(ran, string(row.Event.Payload))
			complete(ctx, t, d, row)
		}
	}
	require.ElementsMatch(t, []string{"a3", "undo-a1", "b2"}, ran)
	require.Less(t, slices.Index(ran, "a3"), slices.Index(ran, "undo-a1"), "the compensation runs in its key's order, after what was queued before it")

	states, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{a1.ID, a2.ID, b1.ID, ghost.ID, compA1.ID}})
	require.NoError(t, err)
	for _, id := range []uuid.UUID{a1.ID, a2.ID, b1.ID, ghost.ID} {
		require.Equal(t, ferrydriver.InboxRetracted, states[id].State)
		require.True(t, states[id].State.Finished(), "retracted counts as settled")
	}
	require.Equal(t, ferrydriver.InboxProcessed, states[compA1.ID].State)

	// A late delivery of the ghost is ignored; retracting again changes
	// nothing and inserts no second compensation.
	ins, err := d.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: group, Events: []*ferryevent.Event{ghost}})
	require.NoError(t, err)
	require.Equal(t, []bool{false}, ins)
	res, err = d.RetractInbox(ctx, &ferrydriver.RetractInboxParams{Group: group, Retractions: retractions})
	require.NoError(t, err)
	for _, prior := range res {
		require.Equal(t, ferrydriver.InboxRetracted, prior)
	}
	require.Empty(t, claim(ctx, t, d, "w3"), "nothing new to run after a repeated retraction")
}

func testInboxDeadLetters[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	p1, p2 := Event("t", "a", "p1"), Event("t", "b", "p2")
	p2.Type = "Other"
	insert(ctx, t, d, p1, Event("t", "a", "a-after"), p2, Event("t", "b", "b-after"))
	kill(ctx, t, d, "p1", "p2")
	dead, err := d.ListInbox(ctx, &ferrydriver.ListInboxParams{Group: group})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"p1", "p2"}, payloads(dead))
	byType, err := d.ListInbox(ctx, &ferrydriver.ListInboxParams{Group: group, Type: "Other"})
	require.NoError(t, err)
	require.Equal(t, []string{"p2"}, payloads(byType))
	require.Equal(t, "bad p2", byType[0].LastError)
	byKey, err := d.ListInbox(ctx, &ferrydriver.ListInboxParams{Group: group, Key: "a", Since: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Equal(t, []string{"p1"}, payloads(byKey))
	require.Empty(t, claim(ctx, t, d, "w"), "both keys are held")
	counts, err := d.InboxCounts(ctx, group)
	require.NoError(t, err)
	require.Equal(t, int64(2), counts[ferrydriver.InboxDead])
	require.Equal(t, int64(2), counts[ferrydriver.InboxPending])
	require.Zero(t, counts[ferrydriver.InboxProcessing]+counts[ferrydriver.InboxFailed])

	// Redrive p1: it runs again first, with its attempts reset, then its key moves on.
	n, err := d.RedriveInbox(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{p1.ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	rows := claim(ctx, t, d, "w")
	require.Equal(t, []string{"p1"}, payloads(rows))
	require.Equal(t, 1, rows[0].Attempts)
	complete(ctx, t, d, rows[0])
	require.Equal(t, []string{"a-after"}, payloads(claim(ctx, t, d, "w")))

	// Discard p2: it never runs; its key is released.
	n, err = d.DiscardInbox(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{p2.ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"b-after"}, payloads(claim(ctx, t, d, "w2")))
	n, err = d.RedriveInbox(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{p2.ID}})
	require.NoError(t, err)
	require.Zero(t, n, "only DEAD rows can be redriven")
	st, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{p1.ID, p2.ID}})
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessed, st[p1.ID].State)
	require.Equal(t, ferrydriver.InboxDiscarded, st[p2.ID].State)
}

func testInboxRetention[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	done, open := Event("t", "a", "done"), Event("t", "b", "open")
	insert(ctx, t, d, done, open)
	for _, r := range claim(ctx, t, d, "w") {
		if r.Event.ID == done.ID {
			complete(ctx, t, d, r)
		}
	}
	n, err := d.DeleteProcessedInbox(ctx, &ferrydriver.DeleteProcessedInboxParams{Group: group, OlderThan: time.Hour})
	require.NoError(t, err)
	require.Zero(t, n, "younger than the window")
	n, err = d.DeleteProcessedInbox(ctx, &ferrydriver.DeleteProcessedInboxParams{Group: group, OlderThan: 0})
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only the processed row goes")
	st, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{done.ID, open.ID}})
	require.NoError(t, err)
	require.NotContains(t, st, done.ID)
	require.Contains(t, st, open.ID)
	// A key that was forgotten comes back when an event arrives for it.
	again := Event("t", "a", "again")
	insert(ctx, t, d, again)
	require.Eventually(t, func() bool {
		for _, r := range claim(ctx, t, d, "w") {
			if r.Event.ID == again.ID {
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond)
}

func testAwaitSettled[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	ok, bad, never := Event("t", "a", "ok"), Event("t", "b", "bad"), Event("t", "c", "never")
	insert(ctx, t, d, ok, bad, never)
	ids := []uuid.UUID{ok.ID, bad.ID, never.ID, ferryevent.NewID()}
	rows := claim(ctx, t, d, "w")
	require.Len(t, rows, 3)
	type result struct {
		st  map[uuid.UUID]*ferrydriver.InboxRow
		err error
		at  time.Time
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		st, err := d.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: group, EventIDs: ids, Deadline: time.Now().Add(3 * time.Second)})
		res <- result{st, err, time.Now()}
	}()
	time.Sleep(300 * time.Millisecond)
	var finished time.Time
	for _, r := range rows {
		switch r.Event.ID {
		case ok.ID:
			complete(ctx, t, d, r)
		case bad.ID:
			require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: r.Event.ID, Claim: r.Claim, Error: "rejected", Dead: true}))
		}
	}
	finished = time.Now()
	got := <-res
	require.NoError(t, got.err)
	require.Equal(t, ferrydriver.InboxProcessed, got.st[ok.ID].State)
	require.Equal(t, ferrydriver.InboxDead, got.st[bad.ID].State)
	require.Equal(t, "rejected", got.st[bad.ID].LastError)
	require.Equal(t, ferrydriver.InboxProcessing, got.st[never.ID].State, "still running at the deadline")
	require.NotContains(t, got.st, ids[3], "never received")
	require.GreaterOrEqual(t, got.at.Sub(start), 3*time.Second-50*time.Millisecond, "pending events keep it waiting until the deadline")
	_ = finished

	// Already settled events return at once.
	st, err := d.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: group, EventIDs: []uuid.UUID{ok.ID, bad.ID}, Deadline: time.Now().Add(30 * time.Second)})
	require.NoError(t, err)
	require.Len(t, st, 2)
}

// testInboxPolicy: the stored dead policy governs redrive and discard; a
// policy change re-evaluates held keys; a key never runs two rows at once.
func testInboxPolicy[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	setPolicy := func(hold bool) {
		require.NoError(t, d.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: group, HoldDead: hold}))
	}
	fail := func(r *ferrydriver.InboxRow) {
		require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: r.Event.ID, Claim: r.Claim, Error: "bad", Dead: true}))
	}
	// Hold: d1 holds k. Switching to Continue releases the key.
	setPolicy(true)
	d1, next := Event("t", "k", "d1"), Event("t", "k", "next")
	insert(ctx, t, d, d1, next)
	fail(claim(ctx, t, d, "w")[0])
	require.Empty(t, claim(ctx, t, d, "w"))
	setPolicy(false)
	rows := claim(ctx, t, d, "w")
	require.Equal(t, []string{"next"}, payloads(rows), "Continue after Hold: the held key moves on")

	// Continue: redriving d1 while "next" runs must not run two rows of k.
	n, err := d.RedriveInbox(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{d1.ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Empty(t, claim(ctx, t, d, "w2"), "k is busy with next")
	complete(ctx, t, d, rows[0])
	again := claim(ctx, t, d, "w2")
	require.Equal(t, []string{"d1"}, payloads(again), "the redriven row runs once k is free")
	fail(again[0])

	// Continue with two dead rows: discarding the first must not strand k.
	d2 := Event("t", "k", "d2")
	insert(ctx, t, d, d2)
	fail(claim(ctx, t, d, "w")[0])
	n, err = d.DiscardInbox(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{d1.ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	later := Event("t", "k", "later")
	insert(ctx, t, d, later)
	require.Eventually(t, func() bool {
		got := claim(ctx, t, d, "w")
		return len(got) == 1 && string(got[0].Event.Payload) == "later"
	}, 5*time.Second, 50*time.Millisecond, "k is not stranded behind d2")
}

// testInboxPolicyResume: a policy change interrupted during its second
// chunk of keys (its context cancelled) is finished by the next call with
// the same policy: 1,200 keys held behind DEAD heads all run their next
// row after Hold -> Continue, and all are held again after Continue ->
// Hold. A backend that re-evaluates keys in one transaction never calls
// BeforeChunk, and its change is never half-done.
func testInboxPolicyResume[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 10*time.Minute) // a generous guard: 1,200 keys, the suite's other tests beside
	const keys = 1200
	setPolicy := func(hold bool) {
		t.Helper()
		require.NoError(t, d.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: group, HoldDead: hold}))
	}
	// interrupted switches the policy with a context cancelled as the
	// second chunk starts.
	interrupted := func(hold bool) {
		t.Helper()
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		chunks := 0
		err := d.SetInboxPolicy(cctx, &ferrydriver.InboxPolicyParams{Group: group, HoldDead: hold, BeforeChunk: func(chunk int) {
			chunks = chunk + 1
			if chunk == 1 {
				cancel()
			}
		}})
		if chunks >= 2 {
			require.Error(t, err, "the change was cancelled in its second chunk")
		} else {
			require.NoError(t, err)
			t.Logf("%s: the policy change ran in %d chunk(s), not interrupted", d.Name(), chunks)
		}
	}
	// claimAll claims until claims find nothing several times in a row (a
	// claim may look at keys that turn out held, and return nothing while
	// other keys wait).
	claimAll := func(worker string) []*ferrydriver.InboxRow {
		t.Helper()
		var all []*ferrydriver.InboxRow
		for empty := 0; empty < keys/500+2; {
			rows, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: worker, Limit: 500, TTL: 5 * time.Minute})
			require.NoError(t, err)
			if len(rows) == 0 {
				empty++
			} else {
				empty = 0
			}
			all = append(all, rows...)
		}
		return all
	}
	failAll := func(rows []*ferrydriver.InboxRow) {
		t.Helper()
		if b, ok := d.(ferrydriver.InboxBatcher[TTx]); ok {
			// One transaction for them all where the backend can (SQLite
			// takes seconds for 1,200 write transactions under -race).
			fin := &ferrydriver.FinishInboxParams{Group: group}
			for _, r := range rows {
				fin.Rows = append(fin.Rows, ferrydriver.FinishedRow{EventID: r.Event.ID, Claim: r.Claim, State: ferrydriver.InboxDead, Error: "bad"})
			}
			require.NoError(t, d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
				lost, err := b.FinishInboxTx(ctx, tx, fin)
				if err == nil && len(lost) > 0 {
					err = fmt.Errorf("%d claims lost", len(lost))
				}
				return err
			}))
			return
		}
		for _, r := range rows {
			require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: r.Event.ID, Claim: r.Claim, Error: "bad", Dead: true}))
		}
	}
	insertEach := func(payload string) {
		t.Helper()
		var evs []*ferryevent.Event
		for i := range keys {
			evs = append(evs, Event("t", fmt.Sprintf("k%04d", i), payload))
			if len(evs) == 400 || i == keys-1 {
				insert(ctx, t, d, evs...)
				evs = nil
			}
		}
	}

	// Hold: every key's head goes DEAD and holds "next".
	setPolicy(true)
	insertEach("dead")
	insertEach("next")
	heads := claimAll("w")
	require.Len(t, heads, keys)
	require.Equal(t, []string{"dead"}, slices.Compact(slices.Sorted(slices.Values(payloads(heads)))))
	failAll(heads)
	require.Empty(t, claimAll("w"), "every key is held")

	// Hold -> Continue, interrupted, then again: every key runs "next".
	interrupted(false)
	setPolicy(false)
	next := claimAll("w")
	got := map[string]string{}
	for _, r := range next {
		got[r.Event.Key] = string(r.Event.Payload)
	}
	require.Equal(t, keys, len(got), "every key's next event is claimable")
	for k, p := range got {
		require.Equal(t, "next", p, "key %s", k)
	}

	// Continue: "next" goes DEAD too, and a third event is runnable past
	// both. Continue -> Hold, interrupted, then again: every key is held.
	failAll(next)
	insertEach("third")
	interrupted(true)
	setPolicy(true)
	require.Empty(t, payloads(claimAll("w")), "every key is held behind its DEAD rows")
}

// testInboxPages: DEAD rows listed a page at a time, each page after the
// last row of the one before (ListInboxParams.After), give every row once,
// newest failure first; a cursor is refused for unfinished states.
func testInboxPages[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	var evs []*ferryevent.Event
	for i := range 75 {
		evs = append(evs, Event("t", fmt.Sprintf("k%02d", i), strconv.Itoa(i)))
	}
	insert(ctx, t, d, evs...)
	rows, err := d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "w", Limit: 100, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, rows, len(evs))
	for _, r := range rows {
		require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: r.Event.ID, Claim: r.Claim, Error: "bad", Dead: true}))
	}
	seen := map[uuid.UUID]bool{}
	var last *ferrydriver.InboxRow
	var after *ferrydriver.InboxCursor
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "paging ends")
		page, err := d.ListInbox(ctx, &ferrydriver.ListInboxParams{Group: group, Limit: 20, After: after})
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, r := range page {
			require.False(t, seen[r.Event.ID], "event %s listed twice", r.Event.ID)
			seen[r.Event.ID] = true
			if last != nil {
				require.False(t, r.FinishedAt.After(last.FinishedAt), "newest failure first")
			}
			last = r
		}
		after = driverkit.InboxCursorOf(page[len(page)-1])
	}
	require.Len(t, seen, len(evs), "every dead row once")
	_, err = d.ListInbox(ctx, &ferrydriver.ListInboxParams{Group: group, States: []ferrydriver.InboxState{ferrydriver.InboxPending}, After: after})
	require.ErrorIs(t, err, driverkit.ErrCursorNeedsFinishedStates)
}

// testInboxAttempts: a row's history holds its failed attempts (a crashed
// one leaves a gap in the numbers) and its redrives, not its successes nor
// an attempt taken back; it keeps the latest AttemptHistory entries, each
// error cut to AttemptErrorChars.
func testInboxAttempts[TTx any](t *testing.T, d InboxDriver[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	start := time.Now().Add(-time.Second)
	history := func(id uuid.UUID) []ferrydriver.AttemptRecord {
		t.Helper()
		h, err := d.InboxAttempts(ctx, &ferrydriver.InboxAttemptsParams{Group: group, EventID: id})
		require.NoError(t, err)
		for _, e := range h {
			require.WithinRange(t, e.At, start, time.Now().Add(time.Second), "entry %+v", e)
		}
		return h
	}
	brief := func(h []ferrydriver.AttemptRecord) []string {
		out := make([]string, len(h))
		for i, e := range h {
			out[i] = fmt.Sprintf("%d %s %s", e.Attempt, e.State, e.Error)
		}
		return out
	}
	// claimOne claims as a consumer does: a rescue of an expired claim
	// when one is due, else the next runnable row.
	claimOne := func(worker string, ttl time.Duration) *ferrydriver.InboxRow {
		t.Helper()
		var rows []*ferrydriver.InboxRow
		require.Eventually(t, func() bool {
			due, err := d.RescueDue(ctx, group)
			require.NoError(t, err)
			rows, err = d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: worker, Limit: 1, TTL: ttl, Rescue: due})
			require.NoError(t, err)
			return len(rows) == 1
		}, 20*time.Second, 20*time.Millisecond)
		return rows[0]
	}
	fail := func(row *ferrydriver.InboxRow, msg string, dead, uncounted bool) {
		t.Helper()
		require.NoError(t, d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: group, EventID: row.Event.ID, Claim: row.Claim,
			Error: msg, RetryAt: time.Now().Add(-time.Second), Dead: dead, Uncounted: uncounted}))
	}

	a := Event("t", "a", "a")
	insert(ctx, t, d, a)
	require.Empty(t, history(a.ID), "no history before a failure")
	fail(claimOne("w", time.Minute), "first: timeout", false, false)
	// The second attempt crashes: its claim expires with no report.
	claimOne("dies", 200*time.Millisecond)
	third := claimOne("w", time.Minute)
	require.Equal(t, 3, third.Attempts)
	fail(third, "second: <bad> \"input\"", true, false)
	require.Equal(t, []string{"1 failed first: timeout", "3 dead second: <bad> \"input\""}, brief(history(a.ID)),
		"the crashed attempt 2 has no entry")
	n, err := d.RedriveInbox(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{a.ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	redriven, err := d.ListInbox(ctx, &ferrydriver.ListInboxParams{Group: group, States: []ferrydriver.InboxState{ferrydriver.InboxPending}, EventIDs: []uuid.UUID{a.ID}})
	require.NoError(t, err)
	require.Len(t, redriven, 1)
	require.True(t, redriven[0].FinishedAt.IsZero(), "a redriven row is unfinished again: no finish time (%v)", redriven[0].FinishedAt)
	again := claimOne("w", time.Minute)
	require.Equal(t, 1, again.Attempts, "a redrive resets the attempts")
	complete(ctx, t, d, again)
	require.Equal(t, []string{"1 failed first: timeout", "3 dead second: <bad> \"input\"", "3 pending "}, brief(history(a.ID)),
		"the redrive is kept; the attempt that processed adds nothing")

	// An attempt taken back (the handler never ran) is not history; the
	// latest AttemptHistory entries are.
	b := Event("t", "b", "b")
	insert(ctx, t, d, b)
	fail(claimOne("w", time.Minute), "not begun", false, true)
	require.Empty(t, history(b.ID), "an uncounted attempt leaves no entry")
	const failures = driverkit.AttemptHistory + 3
	long := strings.Repeat("é", driverkit.AttemptErrorChars+100)
	for i := 1; i <= failures; i++ {
		msg := "failure " + strconv.Itoa(i)
		if i == failures {
			msg = long
		}
		row := claimOne("w", time.Minute)
		require.Equal(t, i, row.Attempts)
		fail(row, msg, i == failures, false)
	}
	h := history(b.ID)
	require.Len(t, h, driverkit.AttemptHistory, "the history keeps the latest entries")
	require.Equal(t, failures-driverkit.AttemptHistory+1, h[0].Attempt, "the oldest went first")
	require.Equal(t, "failure "+strconv.Itoa(failures-driverkit.AttemptHistory+1), h[0].Error)
	require.Equal(t, failures, h[len(h)-1].Attempt)
	require.Equal(t, ferrydriver.InboxDead, h[len(h)-1].State)
	require.Equal(t, long[:2*driverkit.AttemptErrorChars], h[len(h)-1].Error, "an entry's error is cut to AttemptErrorChars characters")
	rows, err := d.ListInbox(ctx, &ferrydriver.ListInboxParams{Group: group, States: []ferrydriver.InboxState{ferrydriver.InboxDead}, EventIDs: []uuid.UUID{b.ID}})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, long, rows[0].LastError, "the row's last error is whole")

	// Attempts that ended with no report spend the row's MaxAttempts: it
	// goes DEAD with an entry saying so.
	c := Event("t", "c", "c")
	insert(ctx, t, d, c)
	for range 2 {
		claimOne("dies", 100*time.Millisecond)
	}
	var spent []*ferrydriver.InboxRow
	require.Eventually(t, func() bool {
		due, err := d.RescueDue(ctx, group)
		require.NoError(t, err)
		spent, err = d.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "w", Limit: 1, TTL: time.Minute, MaxAttempts: 2, Rescue: due})
		require.NoError(t, err)
		return len(spent) == 1
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, ferrydriver.InboxDead, spent[0].State)
	require.Equal(t, []string{"2 dead " + ferrydriver.ReasonAttemptsExhausted}, brief(history(c.ID)))

	none, err := d.InboxAttempts(ctx, &ferrydriver.InboxAttemptsParams{Group: group, EventID: uuid.New()})
	require.NoError(t, err)
	require.Empty(t, none, "an event the group never received has no history")
}
