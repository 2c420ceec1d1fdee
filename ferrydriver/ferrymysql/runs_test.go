package ferrymysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
	"github.com/ferry-dev/ferry/ferryevent"
)

// runsFixture is a group whose keys have backlogs, claimed in runs.
type runsFixture struct {
	t   *testing.T
	ctx context.Context
	drv *ferrymysql.Driver
	evs map[string]*ferryevent.Event // by payload
}

func newRunsFixture(t *testing.T, keys map[string]int) *runsFixture {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	f := &runsFixture{t: t, ctx: ctx, drv: newDriver(t, nil), evs: map[string]*ferryevent.Event{}}
	var evs []*ferryevent.Event
	for k, n := range keys {
		for i := 1; i <= n; i++ {
			evs = append(evs, f.add(k, i))
		}
	}
	_, err := f.drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: evs})
	require.NoError(t, err)
	return f
}

// add makes event seq of key k (payload k and seq), to insert.
func (f *runsFixture) add(k string, seq int) *ferryevent.Event {
	ev := ferrydrivertest.Event("t", k, k+string(rune('0'+seq)))
	ev.Seq = int64(seq)
	f.evs[string(ev.Payload)] = ev
	return ev
}

// claim claims with the given bounds and returns the rows by payload, in
// the order returned.
func (f *runsFixture) claim(perKey int, ttl time.Duration) ([]string, map[string]*ferrydriver.InboxRow) {
	f.t.Helper()
	return f.claimIn("g", 50, perKey, ttl)
}

func (f *runsFixture) claimIn(group string, limit, perKey int, ttl time.Duration) ([]string, map[string]*ferrydriver.InboxRow) {
	f.t.Helper()
	rows, err := f.drv.ClaimInbox(f.ctx, &ferrydriver.ClaimInboxParams{Group: group, Worker: "w", Limit: limit, PerKey: perKey, Keys: 10, TTL: ttl, MaxAttempts: 5})
	require.NoError(f.t, err)
	var order []string
	by := map[string]*ferrydriver.InboxRow{}
	for _, r := range rows {
		order = append(order, string(r.Event.Payload))
		by[string(r.Event.Payload)] = r
	}
	return order, by
}

func (f *runsFixture) complete(row *ferrydriver.InboxRow, keep bool) {
	f.t.Helper()
	require.NoError(f.t, f.drv.RunInTx(f.ctx, func(ctx context.Context, tx *sql.Tx) error {
		return f.drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: row.Event.ID, Claim: row.Claim, Keep: keep})
	}))
}

// state returns the state and attempts of the event with payload p.
func (f *runsFixture) state(p string) (ferrydriver.InboxState, int) {
	f.t.Helper()
	return f.stateIn("g", p)
}

func (f *runsFixture) stateIn(group, p string) (ferrydriver.InboxState, int) {
	f.t.Helper()
	id := f.evs[p].ID
	got, err := f.drv.InboxStates(f.ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: []uuid.UUID{id}})
	require.NoError(f.t, err)
	require.Contains(f.t, got, id)
	return got[id].State, got[id].Attempts
}

// keyOf filters a claim's payloads to those of key k.
func keyOf(k string, payloads []string) []string {
	var out []string
	for _, p := range payloads {
		if p[:1] == k {
			out = append(out, p)
		}
	}
	return out
}

// TestClaimsTakeRuns: a claim takes a run of each key's PENDING rows, in
// order, under one token; finishes with Keep keep the key claimed, the
// run's last finish frees it, and a finish without Keep, a failure or a
// batch that ends a run early gives the rest back, PENDING and uncounted.
func TestClaimsTakeRuns(t *testing.T) {
	t.Parallel()
	f := newRunsFixture(t, map[string]int{"a": 5, "b": 2, "c": 3, "d": 3})

	order, rows := f.claim(3, time.Minute)
	require.Equal(t, []string{"a1", "a2", "a3"}, keyOf("a", order), "a run of up to PerKey rows, in order")
	require.Equal(t, []string{"b1", "b2"}, keyOf("b", order))
	require.Len(t, order, 11)
	done := map[string]bool{} // keys whose rows came before
	for i, p := range order {
		require.Equal(t, ferrydriver.InboxProcessing, rows[p].State)
		require.Equal(t, 1, rows[p].Attempts)
		require.Equal(t, rows[order[0]].Claim[:36], rows[p].Claim[:36], "one token for the call (a row with later rows in its run marks its claim)")
		if i > 0 && order[i-1][:1] != p[:1] {
			done[order[i-1][:1]] = true
		}
		require.False(t, done[p[:1]], "rows grouped by key: %v", order)
	}

	// a: Keep keeps the key claimed (not due for an ordinary claim; for
	// a rescue at the claim's expiry); the run's last row frees it.
	f.complete(rows["a1"], true)
	f.complete(rows["a2"], true)
	var claimed bool
	require.NoError(t, f.drv.DB().QueryRowContext(f.ctx, `SELECT runnable_at IS NULL AND claim_token IS NOT NULL
       AND rescue_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) + 30000000
 FROM ferry_inbox_keys WHERE group_name = 'g' AND k = 'a'`).Scan(&claimed))
	require.True(t, claimed, "a finish with Keep leaves the key claimed, due for a rescue at the claim's expiry")
	next, _ := f.claim(3, time.Minute)
	require.Empty(t, keyOf("a", next), "the key stays claimed while its run goes on")
	f.complete(rows["a3"], false)
	next, nextRows := f.claim(3, time.Minute)
	require.Equal(t, []string{"a4", "a5"}, keyOf("a", next))
	for _, p := range []string{"a4", "a5"} {
		require.Equal(t, 1, nextRows[p].Attempts)
	}

	// b: a finish without Keep before the run's end gives the rest back.
	f.complete(rows["b1"], false)
	st, attempts := f.state("b2")
	require.Equal(t, ferrydriver.InboxPending, st)
	require.Equal(t, 0, attempts, "given back uncounted")

	// c: a failure gives the rest back, and the failed row, due later,
	// blocks the key's run.
	f.complete(rows["c1"], true)
	require.NoError(t, f.drv.FailInbox(f.ctx, &ferrydriver.FailInboxParams{Group: "g", EventID: rows["c2"].Event.ID, Claim: rows["c2"].Claim,
		Error: "boom", RetryAt: time.Now().Add(time.Hour)}))
	st, attempts = f.state("c3")
	require.Equal(t, ferrydriver.InboxPending, st)
	require.Equal(t, 0, attempts)
	// d: a batch that reports only the run's first row gives the rest back.
	require.NoError(t, f.drv.RunInTx(f.ctx, func(ctx context.Context, tx *sql.Tx) error {
		lost, err := f.drv.FinishInboxTx(ctx, tx, &ferrydriver.FinishInboxParams{Group: "g", Rows: []ferrydriver.FinishedRow{
			{EventID: rows["d1"].Event.ID, Claim: rows["d1"].Claim, State: ferrydriver.InboxProcessed}}})
		require.Empty(t, lost)
		return err
	}))
	for _, p := range []string{"d2", "d3"} {
		st, attempts = f.state(p)
		require.Equal(t, ferrydriver.InboxPending, st, p)
		require.Equal(t, 0, attempts, p)
	}
	next, nextRows = f.claim(3, time.Minute)
	require.Equal(t, []string{"b2"}, keyOf("b", next))
	require.Empty(t, keyOf("c", next), "c2 waits for its retry, and c3 behind it")
	require.Equal(t, []string{"d2", "d3"}, keyOf("d", next))

	// A batch that reports a whole run finishes it.
	require.NoError(t, f.drv.RunInTx(f.ctx, func(ctx context.Context, tx *sql.Tx) error {
		var fin []ferrydriver.FinishedRow
		for _, p := range []string{"d2", "d3"} {
			fin = append(fin, ferrydriver.FinishedRow{EventID: nextRows[p].Event.ID, Claim: nextRows[p].Claim, State: ferrydriver.InboxProcessed})
		}
		_, err := f.drv.FinishInboxTx(ctx, tx, &ferrydriver.FinishInboxParams{Group: "g", Rows: fin})
		return err
	}))
	for _, p := range []string{"d1", "d2", "d3", "a1", "a2", "a3", "b1", "c1"} {
		st, _ := f.state(p)
		require.Equal(t, ferrydriver.InboxProcessed, st, p)
	}
}

// TestRunsStopAtBlockers: with PerKey 1 a claim takes heads only; a run
// never reaches past a FAILED row; a run whose claim expired (its worker
// crashed) is rescued one row at a time, each counting its attempt.
func TestRunsStopAtBlockers(t *testing.T) {
	t.Parallel()
	f := newRunsFixture(t, map[string]int{"a": 3, "b": 3})

	order, rows := f.claim(1, time.Minute)
	require.ElementsMatch(t, []string{"a1", "b1"}, order, "heads only")
	// a1 fails, due at once: the key's head is FAILED, claimed alone.
	require.NoError(t, f.drv.FailInbox(f.ctx, &ferrydriver.FailInboxParams{Group: "g", EventID: rows["a1"].Event.ID, Claim: rows["a1"].Claim,
		Error: "once", RetryAt: time.Now()}))
	f.complete(rows["b1"], false)
	order, rows = f.claim(3, 300*time.Millisecond)
	require.Equal(t, []string{"a1"}, keyOf("a", order), "a run starts at a PENDING head only")
	require.Equal(t, []string{"b2", "b3"}, keyOf("b", order))
	f.complete(rows["a1"], false)

	// b's worker finishes b2 and "crashes": b3's claim expires.
	f.complete(rows["b2"], true)
	time.Sleep(400 * time.Millisecond)
	order, _ = f.claim(3, time.Minute)
	require.Equal(t, []string{"a2", "a3"}, keyOf("a", order))
	require.Empty(t, keyOf("b", order), "an expired claim is left to a rescue")
	rescued, err := f.drv.ClaimInbox(f.ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w", Limit: 1, Rescue: true, TTL: time.Minute, MaxAttempts: 5})
	require.NoError(t, err)
	require.Len(t, rescued, 1)
	require.Equal(t, "b3", string(rescued[0].Event.Payload))
	require.Equal(t, 2, rescued[0].Attempts, "the run's claim and the rescue")
}

// TestRetractionCutsARun: retracting a row of a run being run cuts the
// run's claim short before that row: the worker's rows before it stay its
// own (its finish holds), the rows after it are given back, and the key is
// due when the worker's last row before the cut finishes, not when the
// claim expires.
func TestRetractionCutsARun(t *testing.T) {
	t.Parallel()
	f := newRunsFixture(t, map[string]int{"e": 4})
	order, rows := f.claim(4, time.Minute)
	require.Equal(t, []string{"e1", "e2", "e3", "e4"}, order)
	f.complete(rows["e1"], true)
	res, err := f.drv.RetractInbox(f.ctx, &ferrydriver.RetractInboxParams{Group: "g", Retractions: []ferrydriver.Retraction{{Event: f.evs["e3"]}}})
	require.NoError(t, err)
	require.Equal(t, []ferrydriver.InboxState{ferrydriver.InboxProcessing}, res)
	for p, want := range map[string]ferrydriver.InboxState{"e2": ferrydriver.InboxProcessing, "e3": ferrydriver.InboxRetracted, "e4": ferrydriver.InboxPending} {
		st, attempts := f.state(p)
		require.Equal(t, want, st, p)
		if want == ferrydriver.InboxPending {
			require.Zero(t, attempts, p)
		}
	}
	next, _ := f.claim(4, time.Minute)
	require.Empty(t, next, "the key stays the worker's while it runs e2")
	f.complete(rows["e2"], true) // its run goes on, as far as the worker knows
	err = f.drv.RunInTx(f.ctx, func(ctx context.Context, tx *sql.Tx) error {
		return f.drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: rows["e4"].Event.ID, Claim: rows["e4"].Claim})
	})
	require.ErrorIs(t, err, ferrydriver.ErrClaimLost, "e4 was given back")
	order, _ = f.claim(4, time.Minute)
	require.Equal(t, []string{"e4"}, order, "at once, past the retracted row")
}

// TestRunStopsBeforeAFailedRow: a PENDING head before a FAILED row that
// waits for its retry (a DEAD row redriven under the continue policy)
// runs alone: the run never reaches past the FAILED row.
func TestRunStopsBeforeAFailedRow(t *testing.T) {
	t.Parallel()
	f := newRunsFixture(t, map[string]int{"x": 4})
	require.NoError(t, f.drv.SetInboxPolicy(f.ctx, &ferrydriver.InboxPolicyParams{Group: "g", HoldDead: false}))
	_, rows := f.claim(1, time.Minute)
	require.NoError(t, f.drv.FailInbox(f.ctx, &ferrydriver.FailInboxParams{Group: "g", EventID: rows["x1"].Event.ID, Claim: rows["x1"].Claim, Error: "bad", Dead: true}))
	order, rows := f.claim(1, time.Minute)
	require.Equal(t, []string{"x2"}, order, "the group goes on past a DEAD row")
	require.NoError(t, f.drv.FailInbox(f.ctx, &ferrydriver.FailInboxParams{Group: "g", EventID: rows["x2"].Event.ID, Claim: rows["x2"].Claim,
		Error: "later", RetryAt: time.Now().Add(time.Hour)}))
	n, err := f.drv.RedriveInbox(f.ctx, &ferrydriver.InboxIDsParams{Group: "g", EventIDs: []uuid.UUID{f.evs["x1"].ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	order, _ = f.claim(4, time.Minute)
	require.Equal(t, []string{"x1"}, order, "x3 and x4 wait behind x2")
}

// TestRunsOfTwoGroupsStayApart: the same events in two groups, claimed in
// runs by one driver: a failure in one group gives back that group's run
// only.
func TestRunsOfTwoGroupsStayApart(t *testing.T) {
	t.Parallel()
	f := newRunsFixture(t, map[string]int{"a": 3})
	var evs []*ferryevent.Event
	for _, p := range []string{"a1", "a2", "a3"} {
		evs = append(evs, f.evs[p])
	}
	_, err := f.drv.InsertInbox(f.ctx, &ferrydriver.InsertInboxParams{Group: "h", Events: evs})
	require.NoError(t, err)
	order, g := f.claimIn("g", 10, 3, time.Minute)
	require.Equal(t, []string{"a1", "a2", "a3"}, order)
	order, h := f.claimIn("h", 10, 3, time.Minute)
	require.Equal(t, []string{"a1", "a2", "a3"}, order)
	require.NoError(t, f.drv.FailInbox(f.ctx, &ferrydriver.FailInboxParams{Group: "g", EventID: g["a1"].Event.ID, Claim: g["a1"].Claim, Error: "bad", RetryAt: time.Now()}))
	st, _ := f.stateIn("g", "a2")
	require.Equal(t, ferrydriver.InboxPending, st, "g's run given back")
	for _, p := range []string{"a1", "a2", "a3"} {
		st, _ := f.stateIn("h", p)
		require.Equal(t, ferrydriver.InboxProcessing, st, "h's run untouched")
	}
	require.NoError(t, f.drv.FailInbox(f.ctx, &ferrydriver.FailInboxParams{Group: "h", EventID: h["a1"].Event.ID, Claim: h["a1"].Claim, Error: "bad", RetryAt: time.Now()}))
	st, attempts := f.stateIn("h", "a3")
	require.Equal(t, ferrydriver.InboxPending, st, "and h's given back in its turn")
	require.Zero(t, attempts)
}

// TestARunEndsInAnyProcess: a run is read from the table, not from the
// memory of the driver that claimed it, so a finish by another process (or
// the same after a restart) ends it as the claimer's would: with Keep the
// key stays claimed, without it the rest is given back at once, PENDING
// and uncounted, for the next claim rather than after the claim expires.
func TestARunEndsInAnyProcess(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := mysqltest.Database(t)
	claimer := mysqltest.Open(t, dsn, nil, true)
	other := mysqltest.Open(t, dsn, nil, false)
	f := &runsFixture{t: t, ctx: ctx, drv: claimer, evs: map[string]*ferryevent.Event{}}
	var evs []*ferryevent.Event
	for i := 1; i <= 4; i++ {
		evs = append(evs, f.add("a", i))
	}
	_, err := claimer.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: "g", Events: evs})
	require.NoError(t, err)
	order, rows := f.claim(4, time.Hour)
	require.Equal(t, []string{"a1", "a2", "a3", "a4"}, order)

	f.drv = other
	f.complete(rows["a1"], true)
	next, _ := f.claim(4, time.Hour)
	require.Empty(t, next, "Keep keeps the key claimed while the run goes on")
	f.complete(rows["a2"], false)
	for _, p := range []string{"a3", "a4"} {
		st, attempts := f.state(p)
		require.Equal(t, ferrydriver.InboxPending, st, p)
		require.Zero(t, attempts, p)
	}
	next, rows = f.claim(4, time.Hour)
	require.Equal(t, []string{"a3", "a4"}, next, "the key is due at once")

	// A batch finished by the claimer, reporting the run's first row only.
	f.drv = claimer
	require.NoError(t, claimer.RunInTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := claimer.FinishInboxTx(ctx, tx, &ferrydriver.FinishInboxParams{Group: "g", Rows: []ferrydriver.FinishedRow{
			{EventID: rows["a3"].Event.ID, Claim: rows["a3"].Claim, State: ferrydriver.InboxProcessed}}})
		return err
	}))
	st, attempts := f.state("a4")
	require.Equal(t, ferrydriver.InboxPending, st)
	require.Zero(t, attempts)
}

// TestFinishReadsTheClaimAsItIsNow: a handler's transaction (REPEATABLE
// READ) whose snapshot predates its claim's expiry and a rescue's new
// claim cannot finish its row, with Keep or without: the claim is read as
// it is now, not as the snapshot saw it.
func TestFinishReadsTheClaimAsItIsNow(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{true, false} {
		f := newRunsFixture(t, map[string]int{"s": 2})
		_, rows := f.claim(2, time.Minute)
		tx, err := f.drv.DB().BeginTx(f.ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		require.NoError(t, err)
		var n int
		require.NoError(t, tx.QueryRowContext(f.ctx, `SELECT COUNT(*) FROM ferry_inbox_keys WHERE claim_token IS NOT NULL`).Scan(&n))
		require.Equal(t, 1, n, "the snapshot sees the claim")
		expired, err := f.drv.ExpireClaims(f.ctx, &ferrydriver.ExpireClaimsParams{Group: "g", Worker: "w"})
		require.NoError(t, err)
		require.Equal(t, 1, expired)
		rescued, err := f.drv.ClaimInbox(f.ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "w2", Limit: 1, Rescue: true, TTL: time.Minute})
		require.NoError(t, err)
		require.Len(t, rescued, 1)
		err = f.drv.CompleteInboxTx(f.ctx, tx, &ferrydriver.CompleteInboxParams{Group: "g", EventID: rows["s1"].Event.ID, Claim: rows["s1"].Claim, Keep: keep})
		require.ErrorIs(t, err, ferrydriver.ErrClaimLost, "keep %v", keep)
		require.NoError(t, tx.Rollback())
		st, attempts := f.state("s1")
		require.Equal(t, ferrydriver.InboxProcessing, st, "the rescue's")
		require.Equal(t, 2, attempts)
	}
}
