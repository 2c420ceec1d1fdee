package inboxmodel

import (
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// The rules of a claim stored on the key's row (PostgreSQL, SQLite and
// MongoDB store claims so): a key claimed by a run of its rows holds the
// claim's token, expiry and the range of positions it covers, and its rows
// are not written until their outcomes are known. After a claim expired,
// every row it covered has counted the attempt, and they are suspect up
// to the claim's last position: they run one at a time, each under a
// claim of its own (a rescue), so that the one that crashes its process
// is found and spends only its own attempts. The functions below are what
// such a backend decides from what it reads of a key; it stores the
// outcome. The model above keeps its claims on the rows: the conformance
// suite holds both to the same states.

// Queued is one of a key's unfinished rows as a claim reads it (the rows
// of a key, in order, DEAD rows left out where the policy passes them).
type Queued struct {
	State    ferrydriver.InboxState
	Pos      int64
	Attempts int
	RetryAt  time.Time
}

// Due says whether the row may run at now: PENDING, or FAILED and due.
func (q Queued) Due(now time.Time) bool {
	return q.State == ferrydriver.InboxPending || (q.State == ferrydriver.InboxFailed && !q.RetryAt.After(now))
}

// Spent says whether the row's attempts reached maxAttempts (0: no limit).
func (q Queued) Spent(maxAttempts int) bool { return maxAttempts > 0 && q.Attempts >= maxAttempts }

// Action is what a claim or a rescue does with a key.
type Action int

const (
	// Recompute: nothing of the key runs now; store when it may
	// (NextUnclaimed).
	Recompute Action = iota
	// ClaimRows: claim the rows returned with it.
	ClaimRows
	// GiveUp: the head's attempts are spent: it goes DEAD
	// (ReasonAttemptsExhausted), and the key is recomputed.
	GiveUp
)

// ClaimKey is what an ordinary claim does with a key that was due and is
// not claimed, whose first unfinished rows are queue (at most n, the
// claim's room for the key) and whose rows are suspect through suspects:
// claim its head if due and, after a PENDING head, the rows RunRows takes
// (their indexes in queue are returned); give the head up when its
// attempts are spent; otherwise (a suspect head too: only a rescue runs
// it) recompute the key.
func ClaimKey(queue []Queued, suspects int64, hold bool, n int, now time.Time, maxAttempts int) (Action, []int) {
	switch {
	case len(queue) == 0 || !queue[0].Due(now) || queue[0].Pos <= suspects:
		return Recompute, nil
	case queue[0].Spent(maxAttempts):
		return GiveUp, []int{0}
	}
	run := []int{0}
	if queue[0].State == ferrydriver.InboxPending {
		states := make([]ferrydriver.InboxState, len(queue)-1)
		for i, r := range queue[1:] {
			states[i] = r.State
		}
		for _, i := range RunRows(states, hold, n-1) {
			run = append(run, 1+i)
		}
	}
	return ClaimRows, run
}

// RescueKey is what a rescue does with a key whose claim expired (or whose
// rows are suspect through suspects, the expired claim's last position
// included), and whose head is queue[0] (none when queue is empty): claim
// the head alone when it is suspect and due, give it up when its attempts
// are spent, otherwise recompute the key. It returns how far the key's
// rows are suspect after it: a head given up that was the last suspect
// row leaves none (redriven, it runs as any other row).
func RescueKey(queue []Queued, suspects int64, now time.Time, maxAttempts int) (Action, int64) {
	if len(queue) == 0 || queue[0].Pos > suspects || !queue[0].Due(now) {
		return Recompute, suspects
	}
	if h := queue[0]; h.Spent(maxAttempts) {
		if h.Pos >= suspects {
			suspects = h.Pos - 1
		}
		return GiveUp, suspects
	}
	return ClaimRows, suspects
}

// NextUnclaimed is what a key with no claim, whose head is queue[0] (none
// when queue is empty) and whose rows are suspect through suspects, is
// left saying: held by a DEAD head; due for a rescue at rescueAt while its
// head is suspect; otherwise due for an ordinary claim at runnableAt
// (Schedule). Zero times: not due.
func NextUnclaimed(queue []Queued, suspects int64, now time.Time) (runnableAt, rescueAt time.Time, held bool) {
	if len(queue) == 0 {
		return time.Time{}, time.Time{}, false
	}
	h := queue[0]
	at, held := Schedule(KeyHead{State: h.State, RetryAt: h.RetryAt}, now)
	switch {
	case held:
		return time.Time{}, time.Time{}, true
	case h.Pos <= suspects:
		return time.Time{}, at, false
	}
	return at, time.Time{}, false
}
