package ferrypg

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
)

// Races between a claim and what changes its key's queue while it runs:
// each test puts the transactions in the order that once lost an event,
// ran one twice at once, or deadlocked.

func raceEvent(key string) *ferryevent.Event {
	return &ferryevent.Event{ID: uuid.Must(uuid.NewV7()), Topic: "t", Key: key, Type: "T", Payload: []byte(`{}`), CreatedAt: time.Now()}
}

// waitLockWait waits until a session working in schema waits for a lock
// (a statement started in a goroutine): other tests' sessions, whatever
// they wait for, do not count.
func waitLockWait(t *testing.T, schema string) {
	t.Helper()
	waitSessionWait(t, schema, "wait_event_type", "Lock")
}

// waitSessionWait waits until a session working in schema shows value in
// pg_stat_activity's column (wait_event_type or wait_event).
func waitSessionWait(t *testing.T, schema, column, value string) {
	t.Helper()
	pool := ferrypgtest.Pool(t)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE `+column+` = $2 AND datname = current_database() AND strpos(query, $1) > 0`, schema, value).Scan(&n))
		return n > 0
	}, 30*time.Second, 10*time.Millisecond, "a session of schema %s waits: %s %s", schema, column, value)
}

// raceClaim claims like a consumer of ordinary handlers.
func raceClaim(t *testing.T, drv *Driver[pgx.Tx], group string) []*ferrydriver.InboxRow {
	t.Helper()
	rows, err := drv.ClaimInbox(context.Background(), &ferrydriver.ClaimInboxParams{Group: group, Worker: "w", Limit: 32, PerKey: 32, Keys: 32,
		TTL: time.Minute, MaxAttempts: 10})
	require.NoError(t, err)
	return rows
}

func raceComplete(drv *Driver[pgx.Tx], group string, row *ferrydriver.InboxRow, keep bool) error {
	return drv.RunInTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
		return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: group, EventID: row.Event.ID, Claim: row.Claim, Keep: keep})
	})
}

// drainRuns claims and completes until nothing is left (a few rounds) and
// returns the events it ran.
func drainRuns(t *testing.T, drv *Driver[pgx.Tx], group string) map[uuid.UUID]bool {
	t.Helper()
	ran := map[uuid.UUID]bool{}
	for range 4 {
		rows := raceClaim(t, drv, group) // by key, then position
		for _, r := range rows {
			ran[r.Event.ID] = true
		}
		completeAll(t, drv, group, rows)
	}
	return ran
}

// A delivery whose row's position was taken before a later row of its
// key, but which commits after that later row was claimed, lands inside
// the claim's range: the claim's finish must not move the key past it.
func TestInboxDeliveryInsideAClaimRuns(t *testing.T) {
	for _, ingest := range []bool{false, true} {
		t.Run(map[bool]string{false: "claimed", true: "claimed by its ingest"}[ingest], func(t *testing.T) {
			deliveryInsideAClaimRuns(t, ingest)
		})
	}
}

// deliveryInsideAClaimRuns: the later row is claimed by a claim, or by
// the ingest that delivers it (InsertInboxClaim).
func deliveryInsideAClaimRuns(t *testing.T, ingest bool) {
	ctx := context.Background()
	drv := newTestDriver(t)
	pool := ferrypgtest.Pool(t)
	const g = "g"
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{raceEvent("k"), raceEvent("a")}})
	require.NoError(t, err)
	for _, r := range raceClaim(t, drv, g) {
		require.NoError(t, raceComplete(drv, g, r, false))
	}

	// blocker holds key a's row: a delivery of key a, not committed yet.
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	require.NoError(t, drv.insertInbox(ctx, drv.wrapTx(blocker), g, []*ferryevent.Event{raceEvent("a")}))

	// A delivery of (a, k1): k1's position is taken, then it waits for a.
	k1 := raceEvent("k")
	late := make(chan error, 1)
	go func() {
		_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{raceEvent("a"), k1}})
		late <- err
	}()
	waitLockWait(t, drv.cfg.Schema)

	// k2, a later position, commits and is claimed.
	k2 := raceEvent("k")
	var got []*ferrydriver.InboxRow
	if ingest {
		_, got, err = drv.InsertInboxClaim(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{k2}},
			&ferrydriver.IngestClaimParams{Worker: "w", TTL: time.Minute, Keys: 8, PerKey: 32})
		require.NoError(t, err)
	} else {
		_, err = drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{k2}})
		require.NoError(t, err)
		got = raceClaim(t, drv, g)
	}
	require.Len(t, got, 1)
	require.Equal(t, k2.ID, got[0].Event.ID)

	// k1 commits, below k2 and inside its claim; k2 finishes.
	require.NoError(t, blocker.Commit(ctx))
	require.NoError(t, <-late)
	require.NoError(t, raceComplete(drv, g, got[0], false))

	require.True(t, drainRuns(t, drv, g)[k1.ID], "the row that landed inside the claim runs")
	st, err := drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: g, EventIDs: []uuid.UUID{k1.ID}})
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessed, st[k1.ID].State)
}

// Migration 011 sets a key's done_pos below its first unfinished row,
// DEAD rows counted whatever the group's policy; under Continue a claim's
// range then spans the DEAD row. Redriving it while the claim runs must
// not leave it behind the key.
func TestInboxRedriveInsideAClaimRuns(t *testing.T) {
	ctx := context.Background()
	pool := ferrypgtest.Pool(t)
	drv, err := New(pool, &Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{Steps: 10})
	require.NoError(t, err)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	const g = "g"
	dead := uuid.Must(uuid.NewV7())
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_groups (group_name, hold_dead) VALUES ($1, false)`, g)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox (group_name, event_id, key, topic, type, payload, created_at, state, attempts, finished_at, last_error)
		VALUES ($1, $2, 'k', 't', 'T', '\x7b7d', now(), 'dead', 5, now(), 'boom')`, g, dead)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.inbox_keys (group_name, key) VALUES ($1, 'k')`, g)
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)

	e1, e2 := raceEvent("k"), raceEvent("k")
	_, err = drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{e1, e2}})
	require.NoError(t, err)
	got := raceClaim(t, drv, g)
	require.Len(t, got, 2, "the claim passes over the DEAD row under Continue")

	n, err := drv.RedriveInbox(ctx, &ferrydriver.InboxIDsParams{Group: g, EventIDs: []uuid.UUID{dead}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, drv.RunInTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		fin := &ferrydriver.FinishInboxParams{Group: g}
		for _, r := range got {
			fin.Rows = append(fin.Rows, ferrydriver.FinishedRow{EventID: r.Event.ID, Claim: r.Claim, State: ferrydriver.InboxProcessed})
		}
		_, err := drv.FinishInboxTx(ctx, tx, fin)
		return err
	}))
	require.True(t, drainRuns(t, drv, g)[dead], "the redriven row runs")
}

// A finish reads the group's dead policy with its statement's snapshot and
// locks the key last. A policy change committed in between (here the
// finish waits for its row, which a settlement check holds FOR SHARE)
// must win: under Continue the key does not stay held by the DEAD row.
func TestInboxFinishAppliesThePolicyInForce(t *testing.T) {
	ctx := context.Background()
	drv := newTestDriver(t)
	pool := ferrypgtest.Pool(t)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	const g = "g"
	require.NoError(t, drv.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: g, HoldDead: true}))
	e1, e2 := raceEvent("k"), raceEvent("k")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{e1, e2}})
	require.NoError(t, err)
	got := raceClaim(t, drv, g)
	require.Len(t, got, 2)

	reader, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = reader.Rollback(ctx) }()
	_, err = reader.Exec(ctx, `SELECT 1 FROM `+s+`.inbox WHERE group_name = $1 AND event_id = $2 FOR SHARE`, g, e1.ID)
	require.NoError(t, err)
	failed := make(chan error, 1)
	go func() { // e1's handler gave up: DEAD
		failed <- drv.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: g, EventID: e1.ID, Claim: got[0].Claim, Error: "bad", Dead: true})
	}()
	waitLockWait(t, drv.cfg.Schema)
	require.NoError(t, drv.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: g, HoldDead: false}))
	require.NoError(t, reader.Commit(ctx))
	require.NoError(t, <-failed)

	require.True(t, drainRuns(t, drv, g)[e2.ID], "under Continue, e2 runs after the DEAD e1")
	var held *uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT held_by FROM `+s+`.inbox_keys WHERE group_name = $1 AND key = 'k'`, g).Scan(&held))
	require.Nil(t, held)
}

// A retraction of a later row of a claimed run cuts the claim short: the
// worker keeps the rows before it (no other worker claims them while it
// may be running them), and finds its claim lost at the retracted row.
func TestInboxRetractionCutsAClaimShort(t *testing.T) {
	ctx := context.Background()
	drv := newTestDriver(t)
	const g = "g"
	e1, e2, e3 := raceEvent("k"), raceEvent("k"), raceEvent("k")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{e1, e2, e3}})
	require.NoError(t, err)
	first := raceClaim(t, drv, g)
	require.Len(t, first, 3) // worker 1 runs e1, e2, then e3

	_, err = drv.RetractInbox(ctx, &ferrydriver.RetractInboxParams{Group: g, Retractions: []ferrydriver.Retraction{{Event: e2}}})
	require.NoError(t, err)
	require.Empty(t, raceClaim(t, drv, g), "e1 stays worker 1's while its claim runs")
	st, err := drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: g, EventIDs: []uuid.UUID{e1.ID, e3.ID}})
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessing, st[e1.ID].State)
	require.Equal(t, ferrydriver.InboxPending, st[e3.ID].State, "past the cut, e3 is no longer claimed")

	// Worker 1 applies e1 and its run with it (keeping the claim on the
	// rest, as a run does); e2's effect rolls back, claim lost.
	require.NoError(t, raceComplete(drv, g, first[0], true))
	err = raceComplete(drv, g, first[1], true)
	require.ErrorIs(t, err, ferrydriver.ErrClaimLost)
	// The key goes on with e3 at once, not after the claim's expiry.
	again := raceClaim(t, drv, g)
	require.Len(t, again, 1)
	require.Equal(t, e3.ID, again[0].Event.ID)
	require.NoError(t, raceComplete(drv, g, again[0], false))
	st, err = drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: g, EventIDs: []uuid.UUID{e1.ID, e2.ID, e3.ID}})
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessed, st[e1.ID].State)
	require.Equal(t, ferrydriver.InboxRetracted, st[e2.ID].State)
	require.Equal(t, ferrydriver.InboxProcessed, st[e3.ID].State)
}

// A batch that holds the retracted row and rows before it loses only the
// retracted row's claim (its commit rolls back; the rows before can be
// given back at once).
func TestInboxRetractionLosesABatchOnlyItsRow(t *testing.T) {
	ctx := context.Background()
	drv := newTestDriver(t)
	const g = "g"
	e1, e2 := raceEvent("k"), raceEvent("k")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{e1, e2}})
	require.NoError(t, err)
	got := raceClaim(t, drv, g)
	require.Len(t, got, 2)
	_, err = drv.RetractInbox(ctx, &ferrydriver.RetractInboxParams{Group: g, Retractions: []ferrydriver.Retraction{{Event: e2}}})
	require.NoError(t, err)
	err = drv.RunInTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		fin := &ferrydriver.FinishInboxParams{Group: g}
		for _, r := range got {
			fin.Rows = append(fin.Rows, ferrydriver.FinishedRow{EventID: r.Event.ID, Claim: r.Claim, State: ferrydriver.InboxProcessed})
		}
		lost, err := drv.FinishInboxTx(ctx, tx, fin)
		if err == nil && len(lost) > 0 {
			return &ferrydriver.ClaimsLostError{Lost: lost}
		}
		return err
	})
	var lost *ferrydriver.ClaimsLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, []uuid.UUID{e2.ID}, lost.Lost)
	// Given back, e1 runs again at once.
	require.NoError(t, drv.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: g, EventID: e1.ID, Claim: got[0].Claim, Error: "given back",
		RetryAt: time.Now(), Uncounted: true}))
	require.True(t, drainRuns(t, drv, g)[e1.ID])
}

// A rescue locks a key whose claim expired and then charges the claim's
// rows; a retraction locks its rows and then their keys. Run in that
// order, the rescue must not wait for the row the retraction holds.
func TestInboxRescueAndRetractionDoNotDeadlock(t *testing.T) {
	ctx := context.Background()
	drv := newTestDriver(t)
	pool := ferrypgtest.Pool(t)
	const g = "g"
	ev := raceEvent("k")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{ev}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: g, Worker: "w", Limit: 1, PerKey: 1, TTL: time.Millisecond, MaxAttempts: 10})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Eventually(t, func() bool { due, err := drv.RescueDue(ctx, g); return err == nil && due }, 30*time.Second, 5*time.Millisecond)

	rescue, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = rescue.Rollback(ctx) }()
	var key string
	var expired bool
	var from, through, done, suspects int64
	require.NoError(t, rescue.QueryRow(ctx, drv.queries.inboxRescueKeys, g, 1).Scan(&key, &expired, &from, &through, &done, &suspects))

	retract, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = retract.Rollback(ctx) }()
	r, err := retract.Query(ctx, drv.queries.inboxRetract, g, []string{ev.ID.String()})
	require.NoError(t, err)
	r.Close()
	require.NoError(t, r.Err())
	locked := make(chan error, 1)
	go func() {
		_, err := retract.Exec(ctx, drv.queries.inboxLockKeys, g, []string{"k"})
		locked <- err
	}()
	waitLockWait(t, drv.cfg.Schema)

	_, chargeErr := rescue.Exec(ctx, drv.queries.inboxCharge, g, key, from, through)
	var pgErr *pgconn.PgError
	if errors.As(chargeErr, &pgErr) {
		t.Fatalf("the rescue's charge: %v", chargeErr)
	}
	require.NoError(t, chargeErr)
	// The row is the retraction's: the kill leaves it too.
	killed, err := rescue.Exec(ctx, drv.queries.inboxKill, g, ev.ID, "spent")
	require.NoError(t, err)
	require.Zero(t, killed.RowsAffected())
	require.NoError(t, rescue.Commit(ctx))
	require.NoError(t, <-locked)
	require.NoError(t, retract.Commit(ctx))
}

// Under REPEATABLE READ a finish's statements read with the handler
// transaction's snapshot, which can predate a settlement waiter that read
// the row before it changed: the waiter is told all the same, at the
// commit, not at its deadline.
func TestAwaitSettledUnderRepeatableRead(t *testing.T) {
	ctx := context.Background()
	pool := ferrypgtest.Pool(t)
	drv, err := New(pool, &Config{Schema: ferrypgtest.Schema(t), InboxIsolation: RepeatableRead})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	s := pgx.Identifier{drv.cfg.Schema}.Sanitize()
	const g = "g"
	ev := raceEvent("k")
	_, err = drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{ev}})
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: g, Worker: "w", Limit: 1, PerKey: 1, TTL: time.Minute, MaxAttempts: 10})
	require.NoError(t, err)
	require.Len(t, rows, 1)

	type result struct {
		st  map[uuid.UUID]*ferrydriver.InboxRow
		err error
		at  time.Time
	}
	settled := make(chan result, 1)
	deadline := time.Now().Add(time.Minute)
	require.NoError(t, drv.RunInTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // the handler's statement: the snapshot
			return err
		}
		go func() {
			st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: g, EventIDs: []uuid.UUID{ev.ID}, Deadline: deadline})
			settled <- result{st, err, time.Now()}
		}()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.settle_waiters`).Scan(&n))
			return n == 1
		}, 30*time.Second, 5*time.Millisecond)
		time.Sleep(100 * time.Millisecond) // its first read of the states
		return drv.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: g, EventID: ev.ID, Claim: rows[0].Claim})
	}))
	r := <-settled
	require.NoError(t, r.err)
	require.Equal(t, ferrydriver.InboxProcessed, r.st[ev.ID].State)
	require.True(t, r.at.Before(deadline.Add(-30*time.Second)), "told at the commit, not found at the deadline")
}

// A claim locks its keys at their newest version: a key that a delivery
// updated and committed after the claim's snapshot is locked at a version
// that snapshot cannot see, and the claim's write through it does nothing
// (sqlInboxClaim). Its rows must not be handed out as claimed, the key must
// stay runnable, and the next claim must take them. The claim here sleeps
// between taking its snapshot and locking its keys, so that the delivery
// commits in between.
func TestInboxClaimOfAKeyUpdatedAfterItsSnapshotHandsNothingOut(t *testing.T) {
	ctx := context.Background()
	drv := newTestDriver(t)
	pool := ferrypgtest.Pool(t)
	const g = "g"
	first := raceEvent("k")
	_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{first}})
	require.NoError(t, err)

	slow, err := New(pool, &Config{Schema: drv.cfg.Schema})
	require.NoError(t, err)
	lock := `AND set_config('synchronous_commit', 'off', true) IS NOT NULL`
	require.Contains(t, slow.queries.inboxClaim, lock)
	slow.queries.inboxClaim = strings.Replace(slow.queries.inboxClaim, lock, lock+` AND (SELECT pg_sleep(1)::text) IS NOT NULL`, 1)
	claimed := make(chan []*ferrydriver.InboxRow, 1)
	go func() {
		rows, err := slow.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: g, Worker: "w", Limit: 32, PerKey: 32, Keys: 32, TTL: time.Minute, MaxAttempts: 10})
		assert.NoError(t, err)
		claimed <- rows
	}()
	waitSessionWait(t, drv.cfg.Schema, "wait_event", "PgSleep") // the claim sleeps before locking its keys
	second := raceEvent("k")                                    // raises the key's tail_pos, committed after the claim's snapshot
	_, err = drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{second}})
	require.NoError(t, err)

	require.Empty(t, <-claimed, "a key the claim could not write is not claimed")
	var token *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT claim_token::text FROM `+pgx.Identifier{drv.cfg.Schema}.Sanitize()+`.inbox_keys
		WHERE group_name = $1 AND key = 'k' AND runnable_at IS NOT NULL`, g).Scan(&token))
	require.Nil(t, token)
	rows := raceClaim(t, drv, g)
	require.Len(t, rows, 2, "the next claim takes the key's rows")
	require.Equal(t, []uuid.UUID{first.ID, second.ID}, []uuid.UUID{rows[0].Event.ID, rows[1].Event.ID})
}

// A finish waits for its key's row while a delivery of the key holds it;
// the delivery commits after the finish's snapshot. The finish reaches the
// key row through the version its snapshot sees (lockKeys) and must move
// the newer one the delivery wrote, not miss it: its claim holds, and the
// delivered row runs next. Both finishes that lock keys are tried: a run
// that processed (sqlInboxCompleteRows) and one that failed
// (sqlInboxFinishRows).
func TestInboxFinishThatWaitedForADeliveryOfItsKeyHolds(t *testing.T) {
	for _, state := range []ferrydriver.InboxState{ferrydriver.InboxProcessed, ferrydriver.InboxFailed} {
		t.Run(string(state), func(t *testing.T) {
			ctx := context.Background()
			drv := newTestDriver(t)
			pool := ferrypgtest.Pool(t)
			const g = "g"
			e1 := raceEvent("k")
			_, err := drv.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: g, Events: []*ferryevent.Event{e1}})
			require.NoError(t, err)
			got := raceClaim(t, drv, g)
			require.Len(t, got, 1)

			// blocker holds key k's row: a delivery of key k, not committed yet.
			blocker, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = blocker.Rollback(ctx) }()
			e2 := raceEvent("k")
			require.NoError(t, drv.insertInbox(ctx, drv.wrapTx(blocker), g, []*ferryevent.Event{e2}))

			finished := make(chan error, 1)
			go func() {
				finished <- drv.RunInTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
					lost, err := drv.FinishInboxTx(ctx, tx, &ferrydriver.FinishInboxParams{Group: g,
						Rows: []ferrydriver.FinishedRow{{EventID: e1.ID, Claim: got[0].Claim, State: state, Error: "x", RetryAt: time.Now()}}})
					if err == nil && len(lost) > 0 {
						err = errors.New("the finish's claim was lost")
					}
					return err
				})
			}()
			waitLockWait(t, drv.cfg.Schema)
			require.NoError(t, blocker.Commit(ctx))
			require.NoError(t, <-finished)

			ran := drainRuns(t, drv, g)
			require.True(t, ran[e2.ID], "the delivered row runs after the finish")
			require.Equal(t, state == ferrydriver.InboxFailed, ran[e1.ID], "the failed row runs again, the processed one does not")
			st, err := drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: g, EventIDs: []uuid.UUID{e1.ID, e2.ID}})
			require.NoError(t, err)
			require.Equal(t, ferrydriver.InboxProcessed, st[e1.ID].State)
			require.Equal(t, ferrydriver.InboxProcessed, st[e2.ID].State)
		})
	}
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
