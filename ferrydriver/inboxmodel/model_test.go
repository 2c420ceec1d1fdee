package inboxmodel_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
	"github.com/google/uuid"
)

const (
	pending    = ferrydriver.InboxPending
	processing = ferrydriver.InboxProcessing
	processed  = ferrydriver.InboxProcessed
	failed     = ferrydriver.InboxFailed
	dead       = ferrydriver.InboxDead
	discarded  = ferrydriver.InboxDiscarded
	retracted  = ferrydriver.InboxRetracted
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// world is a model under test with its events named.
type world struct {
	t      *testing.T
	m      *inboxmodel.Inbox
	now    time.Time
	ids    map[string]uuid.UUID
	names  map[uuid.UUID]string
	claims map[string]string // each event's latest claim token
}

func newWorld(t *testing.T) *world {
	return &world{t: t, m: inboxmodel.New(), now: t0, ids: map[string]uuid.UUID{}, names: map[uuid.UUID]string{}, claims: map[string]string{}}
}

func (w *world) ev(key, name string) inboxmodel.Event {
	id, ok := w.ids[name]
	if !ok {
		id = uuid.New()
		w.ids[name], w.names[id] = id, name
	}
	return inboxmodel.Event{ID: id, Key: key}
}

func (w *world) insert(key string, names ...string) {
	for _, n := range names {
		w.m.Insert(w.ev(key, n))
	}
}

// claim claims with p and returns "name:state:attempts" of each row.
func (w *world) claim(p inboxmodel.ClaimParams, keys ...string) []string {
	w.t.Helper()
	if p.TTL == 0 {
		p.TTL = time.Minute
	}
	if p.Limit == 0 {
		p.Limit = 100
	}
	rows, err := w.m.Claim(w.now, p, keys...)
	if err != nil {
		w.t.Fatalf("claim: %v", err)
	}
	var out []string
	for _, r := range rows {
		n := w.names[r.ID]
		if r.State == processing {
			if r.Claim == "" {
				w.t.Fatalf("claimed %s has no claim token", n)
			}
			w.claims[n] = r.Claim
		} else if r.Claim != "" {
			w.t.Fatalf("%s returned %s with claim %q", n, r.State, r.Claim)
		}
		out = append(out, fmt.Sprintf("%s:%s:%d", n, r.State, r.Attempts))
	}
	return out
}

func (w *world) row(name string) inboxmodel.Row {
	r, ok := w.m.Row(w.ids[name])
	if !ok {
		w.t.Fatalf("no row %s", name)
	}
	return r
}

func (w *world) want(name string, state ferrydriver.InboxState, attempts int) {
	w.t.Helper()
	r := w.row(name)
	if r.State != state || r.Attempts != attempts {
		w.t.Fatalf("%s: %s with %d attempts, want %s with %d", name, r.State, r.Attempts, state, attempts)
	}
}

func (w *world) wantClaim(got []string, want ...string) {
	w.t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		w.t.Fatalf("claimed %v, want %v", got, want)
	}
}

func (w *world) complete(name string) error {
	return w.m.Complete(w.now, w.ids[name], w.claims[name], false)
}

func (w *world) completeKeep(name string) error {
	return w.m.Complete(w.now, w.ids[name], w.claims[name], true)
}

func (w *world) fail(p inboxmodel.FailParams, name string) error {
	p.ID, p.Claim = w.ids[name], w.claims[name]
	return w.m.Fail(w.now, p)
}

func (w *world) ok(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) lost(err error) {
	w.t.Helper()
	if !errors.Is(err, ferrydriver.ErrClaimLost) {
		w.t.Fatalf("got %v, want ErrClaimLost", err)
	}
}

func TestModel(t *testing.T) {
	long := inboxmodel.ClaimParams{Worker: "w"}
	short := inboxmodel.ClaimParams{Worker: "w", TTL: time.Second}
	rescue := inboxmodel.ClaimParams{Worker: "w", Rescue: true}
	for _, tc := range []struct {
		name string
		run  func(w *world)
	}{
		{"PendingHeadsClaimOneAKeyInOrder", func(w *world) {
			w.insert("a", "a1", "a2")
			w.insert("b", "b1")
			w.wantClaim(w.claim(long), "a1:processing:1", "b1:processing:1")
			w.wantClaim(w.claim(long)) // both keys busy
			w.want("a2", pending, 0)
			w.ok(w.complete("a1"))
			w.want("a1", processed, 1)
			w.wantClaim(w.claim(long), "a2:processing:1")
		}},
		{"DuplicatesAreIgnored", func(w *world) {
			a1 := w.ev("a", "a1")
			if got := w.m.Insert(a1, a1, w.ev("a", "a2")); fmt.Sprint(got) != "[true false true]" {
				w.t.Fatalf("inserted %v", got)
			}
			if got := w.m.Insert(a1); fmt.Sprint(got) != "[false]" {
				w.t.Fatalf("inserted %v", got)
			}
			if n := len(w.m.Rows()); n != 2 {
				w.t.Fatalf("%d rows", n)
			}
		}},
		{"LimitAndKeysBoundTheKeys", func(w *world) {
			w.insert("a", "a1")
			w.insert("b", "b1")
			w.insert("c", "c1")
			w.wantClaim(w.claim(inboxmodel.ClaimParams{Worker: "w", Limit: 2}), "a1:processing:1", "b1:processing:1")
			w.wantClaim(w.claim(inboxmodel.ClaimParams{Worker: "w", Limit: 5, Keys: 1}), "c1:processing:1")
		}},
		{"ChosenKeysMustBeCandidates", func(w *world) {
			w.insert("a", "a1", "a2")
			w.insert("b", "b1")
			w.wantClaim(w.claim(inboxmodel.ClaimParams{Worker: "w", Limit: 1}, "b"), "b1:processing:1")
			if _, err := w.m.Claim(w.now, long, "b"); !errors.Is(err, inboxmodel.ErrNotCandidate) {
				w.t.Fatalf("a busy key claimed: %v", err)
			}
			if _, err := w.m.Claim(w.now, inboxmodel.ClaimParams{Limit: 1}, "a", "a"); err == nil {
				w.t.Fatal("two keys claimed past the limit")
			}
			w.want("a1", pending, 0)
		}},
		{"FailedRunsWhenDue", func(w *world) {
			w.insert("a", "a1", "a2")
			w.claim(long)
			w.ok(w.fail(inboxmodel.FailParams{Error: "boom", RetryAt: w.now.Add(time.Minute)}, "a1"))
			w.want("a1", failed, 1)
			if r := w.row("a1"); r.LastError != "boom" || r.Claim != "" {
				w.t.Fatalf("failed row %+v", r)
			}
			w.wantClaim(w.claim(long)) // not due: the key waits
			w.now = w.now.Add(time.Minute)
			w.wantClaim(w.claim(long), "a1:processing:2")
		}},
		{"UncountedFailureTakesTheAttemptBack", func(w *world) {
			w.insert("a", "a1")
			w.claim(long)
			w.ok(w.fail(inboxmodel.FailParams{RetryAt: w.now, Uncounted: true}, "a1"))
			w.want("a1", failed, 0)
			w.wantClaim(w.claim(long), "a1:processing:1")
		}},
		{"DeadHoldsWithNoPolicyStored", func(w *world) {
			w.insert("a", "a1", "a2")
			w.claim(long)
			w.ok(w.fail(inboxmodel.FailParams{Dead: true, Error: "bad"}, "a1"))
			w.want("a1", dead, 1)
			w.wantClaim(w.claim(long))
			w.wantClaim(w.claim(rescue))
		}},
		{"DeadHoldsUnderHoldUntilRedriven", func(w *world) {
			w.m.SetPolicy(true)
			w.insert("a", "a1", "a2")
			w.claim(long)
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "a1"))
			w.wantClaim(w.claim(long))
			if n := w.m.Redrive(w.ids["a1"], w.ids["a2"]); n != 1 {
				w.t.Fatalf("redrove %d", n)
			}
			w.want("a1", pending, 0)
			w.wantClaim(w.claim(long), "a1:processing:1")
			w.ok(w.complete("a1"))
			w.wantClaim(w.claim(long), "a2:processing:1")
		}},
		{"DiscardReleasesAHeldKey", func(w *world) {
			w.insert("a", "a1", "a2")
			w.claim(long)
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "a1"))
			if n := w.m.Discard(w.ids["a1"]); n != 1 {
				w.t.Fatalf("discarded %d", n)
			}
			w.want("a1", discarded, 1)
			if n := w.m.Discard(w.ids["a1"]) + w.m.Redrive(w.ids["a1"], w.ids["a2"]); n != 0 {
				w.t.Fatalf("%d rows not DEAD changed", n)
			}
			w.wantClaim(w.claim(long), "a2:processing:1")
		}},
		{"ContinuePassesDeadRows", func(w *world) {
			w.m.SetPolicy(false)
			w.insert("a", "a1", "a2")
			w.claim(long)
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "a1"))
			w.wantClaim(w.claim(long), "a2:processing:1")
			// A redriven row waits for the running one.
			w.m.Redrive(w.ids["a1"])
			w.wantClaim(w.claim(long))
			w.ok(w.complete("a2"))
			w.wantClaim(w.claim(long), "a1:processing:1")
		}},
		{"PolicyChangeReevaluatesKeys", func(w *world) {
			w.m.SetPolicy(true)
			w.insert("a", "a1", "a2", "a3")
			w.claim(long)
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "a1"))
			w.wantClaim(w.claim(long))
			w.m.SetPolicy(false)
			w.wantClaim(w.claim(long), "a2:processing:1")
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "a2"))
			w.m.SetPolicy(true)
			w.wantClaim(w.claim(long))
			w.m.Discard(w.ids["a1"])
			w.wantClaim(w.claim(long)) // a2 holds now
			w.m.Redrive(w.ids["a2"])
			w.wantClaim(w.claim(long), "a2:processing:1")
		}},
		{"ExpiredClaimIsRescuedAlone", func(w *world) {
			w.insert("a", "a1", "a2")
			w.insert("b", "b1")
			w.wantClaim(w.claim(short, "a"), "a1:processing:1")
			first := w.claims["a1"]
			if w.m.RescueDue(w.now) {
				w.t.Fatal("rescue due before the claim expired")
			}
			w.wantClaim(w.claim(rescue))
			w.now = w.now.Add(time.Second)
			if !w.m.RescueDue(w.now) {
				w.t.Fatal("no rescue due")
			}
			w.lost(w.complete("a1"))
			w.wantClaim(w.claim(long), "b1:processing:1") // not the expired key
			w.wantClaim(w.claim(rescue), "a1:processing:2")
			if w.claims["a1"] == first {
				w.t.Fatal("the rescue reused the claim token")
			}
			w.lost(w.m.Complete(w.now, w.ids["a1"], first, false))
			w.lost(w.m.Fail(w.now, inboxmodel.FailParams{ID: w.ids["a1"], Claim: first, Dead: true}))
			w.ok(w.complete("a1"))
			w.wantClaim(w.claim(long), "a2:processing:1")
		}},
		{"ExhaustedAttemptsGoDeadAtTheClaim", func(w *world) {
			w.insert("a", "a1", "a2")
			p := inboxmodel.ClaimParams{Worker: "w", TTL: time.Second, MaxAttempts: 2}
			w.wantClaim(w.claim(p), "a1:processing:1")
			w.now = w.now.Add(time.Second)
			p.Rescue = true
			w.wantClaim(w.claim(p), "a1:processing:2")
			w.now = w.now.Add(time.Second)
			w.wantClaim(w.claim(p), "a1:dead:2")
			if r := w.row("a1"); r.LastError != ferrydriver.ReasonAttemptsExhausted {
				w.t.Fatalf("last error %q", r.LastError)
			}
			w.wantClaim(w.claim(long)) // held
			w.m.SetPolicy(false)
			w.wantClaim(w.claim(long), "a2:processing:1")
		}},
		{"ExhaustedFailedRowGoesDeadAtAnOrdinaryClaim", func(w *world) {
			w.insert("a", "a1")
			p := inboxmodel.ClaimParams{Worker: "w", MaxAttempts: 1}
			w.wantClaim(w.claim(p), "a1:processing:1")
			w.ok(w.fail(inboxmodel.FailParams{Error: "boom", RetryAt: w.now}, "a1"))
			w.wantClaim(w.claim(p), "a1:dead:1")
			if r := w.row("a1"); r.LastError != ferrydriver.ReasonAttemptsExhausted+" (last recorded error: boom)" {
				w.t.Fatalf("last error %q", r.LastError)
			}
		}},
		{"FinishNeedsTheCurrentClaim", func(w *world) {
			w.insert("a", "a1")
			w.claim(long)
			w.lost(w.m.Complete(w.now, w.ids["a1"], "", false))
			w.lost(w.m.Complete(w.now, w.ids["a1"], "another", false))
			w.lost(w.m.Complete(w.now, uuid.New(), w.claims["a1"], false))
			w.ok(w.complete("a1"))
			w.lost(w.complete("a1"))
			w.lost(w.fail(inboxmodel.FailParams{Dead: true}, "a1"))
			w.want("a1", processed, 1)
		}},
		{"ReapedClaimsAreRescued", func(w *world) {
			w.insert("a", "a1")
			w.insert("b", "b1")
			w.claim(inboxmodel.ClaimParams{Worker: "dies", Limit: 1})
			w.claim(inboxmodel.ClaimParams{Worker: "lives", Limit: 1})
			if got := w.m.ClaimHolders(w.now); fmt.Sprint(got) != "[dies lives]" {
				w.t.Fatalf("holders %v", got)
			}
			if n := w.m.ExpireClaims(w.now, "dies"); n != 1 {
				w.t.Fatalf("ended %d", n)
			}
			if n := w.m.ExpireClaims(w.now, "dies"); n != 0 {
				w.t.Fatalf("ended %d again", n)
			}
			if got := w.m.ClaimHolders(w.now); fmt.Sprint(got) != "[lives]" {
				w.t.Fatalf("holders %v", got)
			}
			w.lost(w.complete("a1"))
			w.wantClaim(w.claim(rescue), "a1:processing:2")
			w.ok(w.complete("a1"))
			w.ok(w.complete("b1"))
		}},
		{"RetractedRowsNeverRunAndProcessedOnesAreCompensated", func(w *world) {
			w.insert("a", "a1", "a2", "a3")
			w.insert("b", "b1", "b2")
			w.wantClaim(w.claim(long), "a1:processing:1", "b1:processing:1")
			w.ok(w.complete("a1"))
			undo := w.ev("a", "undo-a1")
			rs := []inboxmodel.Retraction{{Event: w.ev("a", "a1"), Compensation: &undo}, {Event: w.ev("a", "a2")},
				{Event: w.ev("b", "b1")}, {Event: w.ev("c", "ghost")}}
			if got := w.m.Retract(rs...); fmt.Sprint(got) != "[processed pending processing ]" {
				w.t.Fatalf("prior %v", got)
			}
			w.lost(w.complete("b1"))
			for _, n := range []string{"a1", "a2", "b1", "ghost"} {
				w.want(n, retracted, w.row(n).Attempts)
			}
			if got := w.m.Insert(w.ev("c", "ghost")); got[0] {
				w.t.Fatal("a retracted event was inserted again")
			}
			w.wantClaim(w.claim(long), "a3:processing:1", "b2:processing:1")
			w.ok(w.complete("a3"))
			w.wantClaim(w.claim(long), "undo-a1:processing:1")
			if got := w.m.Retract(rs...); fmt.Sprint(got) != "[retracted retracted retracted retracted]" {
				w.t.Fatalf("prior %v", got)
			}
			if n := len(w.m.Rows()); n != 7 {
				w.t.Fatalf("%d rows: a second compensation", n)
			}
		}},
		{"RetractionReleasesAHeldKey", func(w *world) {
			w.insert("a", "a1", "a2")
			w.claim(long)
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "a1"))
			w.m.Retract(inboxmodel.Retraction{Event: w.ev("a", "a1")})
			w.wantClaim(w.claim(long), "a2:processing:1")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(newWorld(t)) })
	}
}

// TestModelRuns: claims of runs of a key's rows (ClaimParams.PerKey).
func TestModelRuns(t *testing.T) {
	runs := func(perKey, limit int) inboxmodel.ClaimParams {
		return inboxmodel.ClaimParams{Worker: "w", PerKey: perKey, Limit: limit}
	}
	for _, tc := range []struct {
		name string
		run  func(w *world)
	}{
		{"PendingRowsAfterAPendingHead", func(w *world) {
			w.insert("a", "a1", "a2", "a3", "a4")
			w.insert("b", "b1")
			w.wantClaim(w.claim(runs(3, 100)), "a1:processing:1", "a2:processing:1", "a3:processing:1", "b1:processing:1")
			if w.claims["a1"] != w.claims["a3"] || w.claims["a1"] != w.claims["b1"] {
				w.t.Fatal("one token a call")
			}
			w.ok(w.completeKeep("a1"))
			w.ok(w.completeKeep("a2"))
			w.want("a3", processing, 1)
			w.wantClaim(w.claim(runs(3, 100))) // a3 still claimed
			w.ok(w.complete("a3"))
			w.wantClaim(w.claim(runs(3, 100)), "a4:processing:1")
		}},
		{"HeadsOnlyWithPerKeyOne", func(w *world) {
			w.insert("a", "a1", "a2")
			w.wantClaim(w.claim(runs(1, 100)), "a1:processing:1")
		}},
		{"LimitCountsRows", func(w *world) {
			w.insert("a", "a1", "a2", "a3")
			w.insert("b", "b1")
			w.wantClaim(w.claim(runs(5, 2)), "a1:processing:1", "a2:processing:1")
			w.ok(w.complete("a1")) // a2 given back, uncounted
			w.want("a2", pending, 0)
			if _, err := w.m.Claim(w.now, runs(5, 2), "a", "b"); err == nil {
				w.t.Fatal("b claimed past the limit of rows")
			}
			w.wantClaim(w.claim(runs(5, 2), "b"), "b1:processing:1")
			w.wantClaim(w.claim(runs(5, 100)), "a2:processing:1", "a3:processing:1")
		}},
		{"FailureGivesTheRestBack", func(w *world) {
			w.insert("a", "a1", "a2", "a3")
			w.claim(runs(3, 100))
			w.ok(w.completeKeep("a1"))
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "a2"))
			w.want("a3", pending, 0)
			w.lost(w.complete("a3"))
			w.wantClaim(w.claim(runs(3, 100)))
			w.m.SetPolicy(false)
			w.wantClaim(w.claim(runs(3, 100)), "a3:processing:1")
		}},
		{"RunsStopBeforeARowThatCannotRun", func(w *world) {
			w.m.SetPolicy(false)
			w.insert("a", "a1", "a2", "a3", "a4")
			w.claim(long1())
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "a1"))
			w.claim(long1())
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "a2"))
			w.m.Redrive(w.ids["a1"])
			// Continue: the DEAD a2 is passed over.
			w.wantClaim(w.claim(runs(5, 100)), "a1:processing:1", "a3:processing:1", "a4:processing:1")
			w.ok(w.complete("a1"))
			w.m.SetPolicy(true)
			w.m.Redrive(w.ids["a2"])
			w.wantClaim(w.claim(runs(5, 100)), "a2:processing:1", "a3:processing:1", "a4:processing:1")
			w.ok(w.fail(inboxmodel.FailParams{RetryAt: w.now.Add(time.Hour)}, "a2"))
			w.insert("b", "b1", "b2")
			w.claim(long1())
			w.ok(w.fail(inboxmodel.FailParams{Dead: true}, "b1"))
			w.m.Redrive(w.ids["b1"])
			w.m.SetPolicy(false)
			w.wantClaim(w.claim(runs(5, 100)), "b1:processing:1", "b2:processing:1")
		}},
		{"NoRunAfterAFailedHead", func(w *world) {
			w.insert("a", "a1", "a2")
			w.claim(long1())
			w.ok(w.fail(inboxmodel.FailParams{RetryAt: w.now}, "a1"))
			w.wantClaim(w.claim(runs(5, 100)), "a1:processing:2")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			tc.run(w)
		})
	}
}

func long1() inboxmodel.ClaimParams { return inboxmodel.ClaimParams{Worker: "w", Limit: 100} }

// The rules backends call on what they read of one key: Decide (through
// the model's tests above), Schedule and RunRows.
func TestScheduleAndRunRows(t *testing.T) {
	later, retry := t0.Add(time.Minute), t0.Add(time.Hour)
	for _, c := range []struct {
		name string
		h    inboxmodel.KeyHead
		at   time.Time
		held bool
	}{
		{"no head: nothing to run", inboxmodel.KeyHead{}, time.Time{}, false},
		{"PENDING: now", inboxmodel.KeyHead{State: pending}, t0, false},
		{"FAILED: at its retry", inboxmodel.KeyHead{State: failed, RetryAt: retry}, retry, false},
		{"PROCESSING: at its claim's expiry", inboxmodel.KeyHead{State: processing, ClaimExpires: later}, later, false},
		{"DEAD: holds the key", inboxmodel.KeyHead{State: dead}, time.Time{}, true},
		{"another row runs: when its claim expires", inboxmodel.KeyHead{State: pending, BusyUntil: later}, later, false},
		{"another row runs behind a DEAD head", inboxmodel.KeyHead{State: dead, BusyUntil: later}, later, false},
	} {
		at, held := inboxmodel.Schedule(c.h, t0)
		if !at.Equal(c.at) || held != c.held {
			t.Errorf("%s: Schedule = %v, %v; want %v, %v", c.name, at, held, c.at, c.held)
		}
	}
	for _, c := range []struct {
		name string
		next []ferrydriver.InboxState
		hold bool
		n    int
		want []int
	}{
		{"PENDING rows up to n", []ferrydriver.InboxState{pending, pending, pending}, true, 2, []int{0, 1}},
		{"stops at FAILED", []ferrydriver.InboxState{pending, failed, pending}, true, 5, []int{0}},
		{"stops at PROCESSING", []ferrydriver.InboxState{processing, pending}, true, 5, nil},
		{"stops at DEAD under Hold", []ferrydriver.InboxState{pending, dead, pending}, true, 5, []int{0}},
		{"passes DEAD under Continue", []ferrydriver.InboxState{pending, dead, pending}, false, 5, []int{0, 2}},
		{"n of 0 takes nothing", []ferrydriver.InboxState{pending}, true, 0, nil},
	} {
		if got := inboxmodel.RunRows(c.next, c.hold, c.n); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: RunRows = %v, want %v", c.name, got, c.want)
		}
	}
}
