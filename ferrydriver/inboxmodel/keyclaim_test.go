package inboxmodel_test

import (
	"slices"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
)

// The decisions of a claim stored on the key's row, one case per branch.
func TestKeyClaimDecisions(t *testing.T) {
	retry := t0.Add(time.Hour)
	p := func(pos int64) inboxmodel.Queued { return inboxmodel.Queued{State: pending, Pos: pos} }
	f := func(pos int64, at time.Time) inboxmodel.Queued {
		return inboxmodel.Queued{State: failed, Pos: pos, RetryAt: at}
	}
	d := func(pos int64) inboxmodel.Queued { return inboxmodel.Queued{State: dead, Pos: pos} }
	spent := func(q inboxmodel.Queued) inboxmodel.Queued { q.Attempts = 2; return q }

	for _, c := range []struct {
		name     string
		queue    []inboxmodel.Queued
		suspects int64
		hold     bool
		n        int
		act      inboxmodel.Action
		run      []int
	}{
		{"nothing queued", nil, 0, true, 4, inboxmodel.Recompute, nil},
		{"FAILED head before its retry", []inboxmodel.Queued{f(1, retry), p(2)}, 0, true, 4, inboxmodel.Recompute, nil},
		{"DEAD head holding", []inboxmodel.Queued{d(1), p(2)}, 0, true, 4, inboxmodel.Recompute, nil},
		{"spent head", []inboxmodel.Queued{spent(p(1)), p(2)}, 0, true, 4, inboxmodel.GiveUp, []int{0}},
		{"PENDING head and its run, up to n", []inboxmodel.Queued{p(1), p(2), p(3)}, 0, true, 2, inboxmodel.ClaimRows, []int{0, 1}},
		{"the run stops at a FAILED row", []inboxmodel.Queued{p(1), f(2, t0), p(3)}, 0, true, 4, inboxmodel.ClaimRows, []int{0}},
		{"a due FAILED head runs alone", []inboxmodel.Queued{f(1, t0), p(2)}, 0, true, 4, inboxmodel.ClaimRows, []int{0}},
		{"the run passes DEAD rows under Continue", []inboxmodel.Queued{p(1), d(2), p(3)}, 0, false, 4, inboxmodel.ClaimRows, []int{0, 2}},
		{"and stops at them under Hold", []inboxmodel.Queued{p(1), d(2), p(3)}, 0, true, 4, inboxmodel.ClaimRows, []int{0}},
		{"a suspect head is left to a rescue", []inboxmodel.Queued{p(1), p(2)}, 1, true, 4, inboxmodel.Recompute, nil},
	} {
		act, run := inboxmodel.ClaimKey(c.queue, c.suspects, c.hold, c.n, t0, 2)
		if act != c.act || !slices.Equal(run, c.run) {
			t.Errorf("ClaimKey, %s: %v %v; want %v %v", c.name, act, run, c.act, c.run)
		}
	}

	for _, c := range []struct {
		name         string
		queue        []inboxmodel.Queued
		suspects     int64
		act          inboxmodel.Action
		wantSuspects int64
	}{
		{"nothing queued", nil, 5, inboxmodel.Recompute, 5},
		{"a head past the suspect rows", []inboxmodel.Queued{p(6)}, 5, inboxmodel.Recompute, 5},
		{"a suspect head before its retry", []inboxmodel.Queued{f(3, retry)}, 5, inboxmodel.Recompute, 5},
		{"a suspect head, due", []inboxmodel.Queued{p(3)}, 5, inboxmodel.ClaimRows, 5},
		{"a spent suspect head", []inboxmodel.Queued{spent(f(3, t0))}, 5, inboxmodel.GiveUp, 5},
		{"the last suspect row, spent, leaves none", []inboxmodel.Queued{spent(p(5))}, 5, inboxmodel.GiveUp, 4},
	} {
		act, s := inboxmodel.RescueKey(c.queue, c.suspects, t0, 2)
		if act != c.act || s != c.wantSuspects {
			t.Errorf("RescueKey, %s: %v %d; want %v %d", c.name, act, s, c.act, c.wantSuspects)
		}
	}

	for _, c := range []struct {
		name             string
		queue            []inboxmodel.Queued
		suspects         int64
		runnable, rescue time.Time
		held             bool
	}{
		{"nothing queued", nil, 0, time.Time{}, time.Time{}, false},
		{"PENDING: runnable now", []inboxmodel.Queued{p(1)}, 0, t0, time.Time{}, false},
		{"FAILED: at its retry", []inboxmodel.Queued{f(1, retry)}, 0, retry, time.Time{}, false},
		{"DEAD: held", []inboxmodel.Queued{d(1)}, 0, time.Time{}, time.Time{}, true},
		{"DEAD and suspect: held", []inboxmodel.Queued{d(1)}, 3, time.Time{}, time.Time{}, true},
		{"suspect PENDING: a rescue now", []inboxmodel.Queued{p(2)}, 3, time.Time{}, t0, false},
		{"suspect FAILED: a rescue at its retry", []inboxmodel.Queued{f(3, retry)}, 3, time.Time{}, retry, false},
	} {
		runnable, rescue, held := inboxmodel.NextUnclaimed(c.queue, c.suspects, t0)
		if !runnable.Equal(c.runnable) || !rescue.Equal(c.rescue) || held != c.held {
			t.Errorf("NextUnclaimed, %s: %v %v %v; want %v %v %v", c.name, runnable, rescue, held, c.runnable, c.rescue, c.held)
		}
	}
}
