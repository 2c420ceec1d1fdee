package ferrydrivertest

import (
	"fmt"
)

// mstep is one step of a situation.
type mstep struct {
	op    string // insert, claim, complete, fail, redrive, discard, retract, policy, expire, reap
	key   string
	names []string
	claim mclaim
	// stale finishes under the row's first claim instead of its latest.
	stale bool
	// keep completes with CompleteInboxParams.Keep.
	keep            bool
	dead, uncounted bool
	due             bool // a failure's retry time has come
	hold            bool
	worker          string
}

// mclaim are a claim step's parameters.
type mclaim struct {
	Worker      string
	Limit, Keys int
	PerKey      int
	MaxAttempts int
	Short       bool // expires after modelShortTTL
	Rescue      bool
}

func (s mstep) String() string {
	switch s.op {
	case "insert":
		return fmt.Sprintf("insert %v on key %s", s.names, s.key)
	case "claim":
		return fmt.Sprintf("claim %+v", s.claim)
	case "complete":
		return fmt.Sprintf("complete %s (stale claim: %v, keep: %v)", s.names[0], s.stale, s.keep)
	case "fail":
		return fmt.Sprintf("fail %s (dead %v, due %v, uncounted %v, stale claim %v)", s.names[0], s.dead, s.due, s.uncounted, s.stale)
	case "policy":
		return fmt.Sprintf("set policy HoldDead=%v", s.hold)
	case "expire":
		return "wait past the short claims' expiry"
	case "reap":
		return "expire the claims of worker " + s.worker
	}
	return fmt.Sprintf("%s %v", s.op, s.names)
}

func ins(key string, names ...string) mstep { return mstep{op: "insert", key: key, names: names} }

func claimLive() mstep { return mstep{op: "claim", claim: mclaim{Worker: "w", Limit: 100}} }

func claimP(c mclaim) mstep { return mstep{op: "claim", claim: c} }

func rescueLive() mstep {
	return mstep{op: "claim", claim: mclaim{Worker: "w2", Limit: 100, Rescue: true}}
}

func done(name string) mstep { return mstep{op: "complete", names: []string{name}} }

func doneKeep(name string) mstep { return mstep{op: "complete", names: []string{name}, keep: true} }

func doneStale(name string) mstep { return mstep{op: "complete", names: []string{name}, stale: true} }

func failDue(name string) mstep { return mstep{op: "fail", names: []string{name}, due: true} }

func failLater(name string) mstep { return mstep{op: "fail", names: []string{name}} }

func failDead(name string) mstep { return mstep{op: "fail", names: []string{name}, dead: true} }

func failUncounted(name string) mstep {
	return mstep{op: "fail", names: []string{name}, due: true, uncounted: true}
}

func failDeadStale(name string) mstep {
	return mstep{op: "fail", names: []string{name}, dead: true, stale: true}
}

func redrive(names ...string) mstep { return mstep{op: "redrive", names: names} }

func discard(names ...string) mstep { return mstep{op: "discard", names: names} }

// retract retracts events by name; "a1>undo-a1" gives a1 the compensation
// undo-a1 (on a1's key). A name never inserted is an event the group
// never received, on key "ghosts".
func retract(names ...string) mstep { return mstep{op: "retract", names: names} }

func policy(hold bool) mstep { return mstep{op: "policy", hold: hold} }

func expire() mstep { return mstep{op: "expire"} }

func reap(worker string) mstep { return mstep{op: "reap", worker: worker} }

// situation is one script of the table.
type situation struct {
	name  string
	steps []mstep
}

// modelSituations cover every transition of inboxmodel: claims of PENDING,
// FAILED (due or not) and expired heads, busy keys, Limit and Keys,
// MaxAttempts at an ordinary claim and at a rescue, runs (PerKey) and
// their give-backs, complete (with and without Keep) and fail under current,
// stale and lost claims, uncounted failures, both dead policies and their
// changes, redrive and discard (of DEAD rows and others), retraction, and
// reaped claims.
var modelSituations = []situation{
	{"HeadsRunOneAKeyInOrder", []mstep{
		ins("a", "a1", "a2"), ins("b", "b1"), claimLive(), claimLive(),
		done("a1"), claimLive(), done("a2"), done("b1"), claimLive(),
	}},
	{"LimitBoundsTheKeys", []mstep{
		ins("a", "a1"), ins("b", "b1"), ins("c", "c1", "c2"),
		claimP(mclaim{Worker: "w", Limit: 2}), claimP(mclaim{Worker: "w", Limit: 2}), claimLive(),
	}},
	{"FailedRunsWhenDue", []mstep{
		ins("a", "a1", "a2"), ins("b", "b1", "b2"), claimLive(),
		failLater("a1"), failDue("b1"), claimLive(), done("b1"), claimLive(), failDue("b2"), claimLive(), done("b2"),
	}},
	{"UncountedFailureTakesTheAttemptBack", []mstep{
		ins("a", "a1"), claimLive(), failUncounted("a1"), claimLive(), failUncounted("a1"), claimLive(), done("a1"),
	}},
	{"FinishNeedsTheCurrentClaim", []mstep{
		ins("a", "a1", "a2"), claimLive(), done("a1"), done("a1"), failDead("a1"), claimLive(), failDead("a2"), done("a2"),
	}},
	{"DeadHoldsWithNoPolicyStored", []mstep{
		ins("a", "a1", "a2"), ins("b", "b1"), claimLive(), failDead("a1"), done("b1"), claimLive(), rescueLive(),
		discard("a1"), claimLive(), done("a2"),
	}},
	{"HoldUntilRedriven", []mstep{
		policy(true), ins("a", "a1", "a2"), claimLive(), failDead("a1"), claimLive(),
		redrive("a1", "a2"), claimLive(), done("a1"), claimLive(), done("a2"),
		redrive("a1"), discard("a1", "a2"),
	}},
	{"ContinuePassesDeadRows", []mstep{
		policy(false), ins("a", "a1", "a2", "a3"), claimLive(), failDead("a1"), claimLive(),
		redrive("a1"), claimLive(), done("a2"), claimLive(), failDead("a1"), claimLive(),
		discard("a1"), done("a3"), claimLive(),
	}},
	{"PolicyChangesReevaluateKeys", []mstep{
		policy(true), ins("a", "a1", "a2", "a3"), claimLive(), failDead("a1"), claimLive(),
		policy(false), claimLive(), failDead("a2"), policy(true), claimLive(),
		discard("a1"), claimLive(), redrive("a2"), claimLive(), done("a2"), claimLive(),
	}},
	{"ExpiredClaimIsRescuedAlone", []mstep{
		ins("a", "a1", "a2"), claimP(mclaim{Worker: "w", Limit: 100, Short: true}), ins("b", "b1"), expire(),
		claimLive(), rescueLive(), doneStale("a1"), failDeadStale("a1"), done("a1"), claimLive(),
	}},
	{"StaleFinishAfterExpiry", []mstep{
		ins("a", "a1"), claimP(mclaim{Worker: "w", Limit: 100, Short: true}), expire(), done("a1"), failDead("a1"),
		rescueLive(), done("a1"),
	}},
	{"ExhaustedAtRescueHolds", []mstep{
		ins("a", "a1", "a2"),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 2, Short: true}), expire(),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 2, Short: true, Rescue: true}), expire(),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 2, Rescue: true}), claimLive(), discard("a1"), claimLive(),
	}},
	{"RedrivenAfterExhaustedAtRescue", []mstep{
		ins("a", "a1", "a2"), ins("b", "b1", "b2"),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 1, Short: true}), expire(),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 1, Rescue: true}), claimLive(), redrive("a1", "b1"), claimLive(), rescueLive(),
		done("a1"), done("b1"), claimLive(),
	}},
	{"ExhaustedAtRescueContinues", []mstep{
		policy(false), ins("a", "a1", "a2"),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 1, Short: true}), expire(),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 1, Rescue: true}), claimLive(), done("a2"),
	}},
	{"ExhaustedFailedRowGoesDeadAtAnOrdinaryClaim", []mstep{
		ins("a", "a1", "a2"), claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 2}), failDue("a1"),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 2}), failDue("a1"),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 2}), claimLive(), discard("a1"), claimLive(),
	}},
	{"ReapedClaimsAreRescued", []mstep{
		ins("a", "a1"), claimP(mclaim{Worker: "dies", Limit: 1}), ins("b", "b1"), claimP(mclaim{Worker: "lives", Limit: 1}),
		reap("dies"), reap("dies"), claimLive(), rescueLive(), doneStale("a1"), done("a1"), done("b1"),
	}},
	{"RetractedRowsNeverRun", []mstep{
		ins("a", "a1", "a2", "a3"), ins("b", "b1", "b2"), claimLive(), done("a1"),
		retract("a1>undo-a1", "a2", "b1", "ghost"), done("b1"), claimLive(), done("a3"), done("b2"), claimLive(),
		ins("ghosts", "ghost"), retract("a1>undo-a1", "a2", "b1", "ghost"), claimLive(),
	}},
	{"PolicyChangeUnderALiveClaim", []mstep{
		policy(false), ins("a", "a1", "a2", "a3"), claimLive(), failDead("a1"), claimLive(), policy(true), done("a2"), claimLive(),
		discard("a1"), claimLive(),
	}},
	{"RetractAnExpiredClaim", []mstep{
		ins("a", "a1", "a2"), claimP(mclaim{Worker: "w", Limit: 100, Short: true}), expire(), retract("a1"), claimLive(), rescueLive(),
	}},
	{"RetractADiscardedRow", []mstep{
		ins("a", "a1"), claimLive(), failDead("a1"), discard("a1"), retract("a1"),
	}},
	{"ExhaustedRowCountsTowardTheLimit", []mstep{
		ins("a", "a1"), claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 1}), failDue("a1"), ins("b", "b1"),
		claimP(mclaim{Worker: "w", Limit: 1, MaxAttempts: 1}), claimLive(),
	}},
	{"KeysBoundTheKeys", []mstep{
		ins("a", "a1"), ins("b", "b1"), ins("c", "c1"), claimP(mclaim{Worker: "w", Limit: 100, Keys: 2}), claimLive(),
	}},
	{"DuplicatesAreIgnored", []mstep{
		ins("a", "a1", "a2"), ins("a", "a1"), ins("a", "a1", "a3"), claimLive(),
	}},
	{"ReapedClaimExhausted", []mstep{
		ins("a", "a1", "a2"), claimP(mclaim{Worker: "dies", Limit: 100, MaxAttempts: 1}), reap("dies"),
		claimP(mclaim{Worker: "w", Limit: 100, MaxAttempts: 1, Rescue: true}), claimLive(),
	}},
	{"RunsOfPendingRows", []mstep{
		ins("a", "a1", "a2", "a3", "a4"), ins("b", "b1"), claimP(mclaim{Worker: "w", Limit: 100, PerKey: 3}),
		doneKeep("a1"), doneKeep("a2"), claimLive(), done("a3"), done("b1"), claimP(mclaim{Worker: "w", Limit: 100, PerKey: 3}), done("a2"),
		claimLive(), done("a3"), claimLive(), done("a4"),
	}},
	{"CompleteWithoutKeepGivesTheRunBack", []mstep{
		ins("a", "a1", "a2", "a3", "a4", "a5"), claimP(mclaim{Worker: "w", Limit: 3, PerKey: 10}), done("a1"), doneStale("a2"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 2}), doneKeep("a2"), done("a3"), claimLive(), done("a4"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 2}), done("a5"),
	}},
	{"RunsShareTheLimit", []mstep{
		ins("a", "a1", "a2", "a3"), claimP(mclaim{Worker: "w", Limit: 2, PerKey: 5}), ins("b", "b1", "b2", "b3"),
		claimP(mclaim{Worker: "w", Limit: 2, PerKey: 5}), claimP(mclaim{Worker: "w", Limit: 2, PerKey: 5}),
		done("a1"), claimP(mclaim{Worker: "w", Limit: 100, PerKey: 5}),
	}},
	{"RunsFillTheLimitKeyByKey", []mstep{
		ins("a", "a1", "a2", "a3"), ins("b", "b1", "b2", "b3"), ins("c", "c1"),
		claimP(mclaim{Worker: "w", Limit: 2, PerKey: 5}), claimP(mclaim{Worker: "w", Limit: 4, PerKey: 2}),
		claimP(mclaim{Worker: "w", Limit: 4, PerKey: 5}),
	}},
	{"FailureInARunGivesTheRestBack", []mstep{
		ins("a", "a1", "a2", "a3", "a4"), claimP(mclaim{Worker: "w", Limit: 100, PerKey: 4}), doneKeep("a1"), failLater("a2"), done("a3"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 4}),
	}},
	{"DeadInARunHoldsOrContinues", []mstep{
		ins("a", "a1", "a2", "a3", "a4"), claimP(mclaim{Worker: "w", Limit: 100, PerKey: 4}), doneKeep("a1"), failDead("a2"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 4}), policy(false), claimP(mclaim{Worker: "w", Limit: 100, PerKey: 4}),
		doneKeep("a3"), done("a4"),
	}},
	{"UncountedFailureInARun", []mstep{
		ins("a", "a1", "a2"), claimP(mclaim{Worker: "w", Limit: 100, PerKey: 2}), failUncounted("a1"), claimLive(), done("a1"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 2}), done("a2"),
	}},
	{"RunsStopBeforeRowsThatCannotRun", []mstep{
		policy(false), ins("a", "a1", "a2", "a3", "a4"), claimLive(), failDead("a1"), claimLive(), failDead("a2"), redrive("a1"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 5}), done("a1"), policy(true), redrive("a2"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 5}), failLater("a2"),
		policy(false), ins("b", "b1", "b2", "b3"), claimLive(), failDead("b1"), claimLive(), failLater("b2"), redrive("b1"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 5}),
		// Under Hold, a run stops at a DEAD row behind its redriven head.
		ins("c", "c1", "c2", "c3"), claimLive(), failDead("c1"), claimLive(), failDead("c2"), policy(true), redrive("c1"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 5}),
	}},
	{"AFailedHeadRunsAlone", []mstep{
		ins("a", "a1", "a2", "a3"), claimLive(), failDue("a1"), claimP(mclaim{Worker: "w", Limit: 100, PerKey: 5}), done("a1"),
		claimP(mclaim{Worker: "w", Limit: 100, PerKey: 5}), doneKeep("a2"), done("a3"),
	}},
	// Not here, for runs: what the rest of a run whose claim expired reads
	// while a rescue runs its head. The backends keep a claim on the key's
	// row as a range of positions, and a rescue narrows it to the head: the
	// rest read PENDING (their attempts counted, suspect), where the model,
	// which claims row by row, reads them PROCESSING under the expired
	// claim. Both run them the same way, each through a rescue of its own
	// once the head finished.
	// Under Continue, a row redriven ahead of a row whose claim expired:
	// an ordinary claim does not take the key (the expired claim's row may
	// still be running somewhere), a rescue is due, and it takes the key's
	// head, the redriven row, first. Not here, what the row whose claim
	// expired reads while the rescue runs: PENDING on the backends (its
	// attempt counted), PROCESSING under the expired claim in the model, as
	// for a run whose claim expired above.
	{"RedrivenAheadOfAnExpiredClaim", []mstep{
		policy(false), ins("a", "a1", "a2"), ins("b", "b1"), claimLive(), failDead("a1"), done("b1"),
		claimP(mclaim{Worker: "w", Limit: 100, Short: true}), expire(), redrive("a1"), claimLive(),
	}},
	{"RetractionReleasesAHeldKey", []mstep{
		ins("a", "a1", "a2"), claimLive(), failDead("a1"), claimLive(), retract("a1"), claimLive(), done("a2"),
	}},
}
