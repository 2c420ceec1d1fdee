package ferrydrivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/inboxmodel"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// The conformance table: each situation is a short script of steps, run
// on the backend and on inboxmodel side by side, in a group of its own.
// After every step the rows a claim returned and the state and attempts of
// every row (InboxStates) must be the same on both sides.
//
// Time: a live claim lasts a minute (longer than any situation), so that
// nothing expires that the model thinks alive; a claim meant to expire
// lasts modelShortTTL, and the step right after it waits past its expiry
// on both sides. A retry is due a second ago or in an hour. The model's
// clock is the test's, read after each backend call: it is never behind
// the backend's.

const (
	modelShortTTL = 500 * time.Millisecond
	modelLiveTTL  = time.Minute
)

// mrun is a situation being run.
type mrun[TTx any] struct {
	t        *testing.T
	ctx      context.Context
	d        InboxDriver[TTx]
	group    string
	sit      string
	step     int
	desc     string
	m        *inboxmodel.Inbox
	events   map[string]*ferryevent.Event
	order    []string            // event names as inserted or retracted
	claims   map[string][]string // the backend's claim tokens of each event, oldest first
	mclaims  map[string][]string // the model's
	expiry   time.Time           // the latest short claim's expiry, by the model
	unwaited bool                // a short claim may or may not have expired yet
}

// testInboxModel runs the conformance table. The situations run one after
// the other: each in a group of its own, but sharing the driver's tables,
// and a claim may leave a row that another transaction holds to a later
// claim, which the contract allows and the model does not foresee (run in
// parallel, MariaDB's claims now and then returned nothing for a
// runnable key).
func testInboxModel[TTx any](t *testing.T, d InboxDriver[TTx]) {
	for i, sit := range modelSituations {
		t.Run(sit.name, func(t *testing.T) {
			r := &mrun[TTx]{t: t, ctx: ctxT(t, 2*time.Minute), d: d, group: fmt.Sprintf("model-%02d", i), sit: sit.name,
				m: inboxmodel.New(), events: map[string]*ferryevent.Event{}, claims: map[string][]string{}, mclaims: map[string][]string{}}
			for j, s := range sit.steps {
				r.step, r.desc = j+1, s.String()
				r.run(s)
				r.compareRows()
			}
		})
	}
}

// failf fails the situation at the current step.
func (r *mrun[TTx]) failf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("situation %s, step %d (%s): %s", r.sit, r.step, r.desc, fmt.Sprintf(format, args...))
}

// same fails unless the backend's and the model's answers agree.
func (r *mrun[TTx]) same(what string, backend, model any) {
	r.t.Helper()
	if fmt.Sprint(backend) != fmt.Sprint(model) {
		r.failf("%s differ:\n  backend: %v\n  model:   %v", what, backend, model)
	}
}

func (r *mrun[TTx]) event(name, key string) *ferryevent.Event {
	ev, ok := r.events[name]
	if !ok {
		ev = Event("t", key, name)
		r.events[name] = ev
		r.order = append(r.order, name)
	}
	return ev
}

func (r *mrun[TTx]) mevent(ev *ferryevent.Event) inboxmodel.Event {
	return inboxmodel.Event{ID: ev.ID, Key: ev.Key}
}

func (r *mrun[TTx]) name(id uuid.UUID) string {
	for n, ev := range r.events {
		if ev.ID == id {
			return n
		}
	}
	return id.String()
}

func (r *mrun[TTx]) ids(names []string) []uuid.UUID {
	out := make([]uuid.UUID, len(names))
	for i, n := range names {
		ev, ok := r.events[n]
		require.True(r.t, ok, "situation %s names %s before inserting it", r.sit, n)
		out[i] = ev.ID
	}
	return out
}

// token is an event's latest claim token (its first, when stale) on each
// side; none for an event never claimed.
func (r *mrun[TTx]) token(name string, stale bool) (backend, model string) {
	b, m := r.claims[name], r.mclaims[name]
	if len(b) != len(m) {
		r.failf("%s was claimed %d times by the backend, %d by the model", name, len(b), len(m))
	}
	if len(b) == 0 {
		return "", ""
	}
	if stale {
		return b[0], m[0]
	}
	return b[len(b)-1], m[len(m)-1]
}

// lostOrNot reduces a finish's outcome to what both sides can say.
func (r *mrun[TTx]) lostOrNot(side string, err error) string {
	r.t.Helper()
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ferrydriver.ErrClaimLost):
		return "claim lost"
	}
	r.failf("%s: %v", side, err)
	return ""
}

func (r *mrun[TTx]) run(s mstep) {
	r.t.Helper()
	ctx, d, m := r.ctx, r.d, r.m
	switch s.op {
	case "insert":
		evs := make([]*ferryevent.Event, len(s.names))
		mevs := make([]inboxmodel.Event, len(s.names))
		for i, n := range s.names {
			evs[i] = r.event(n, s.key)
			mevs[i] = r.mevent(evs[i])
		}
		res, err := d.InsertInbox(ctx, &ferrydriver.InsertInboxParams{Group: r.group, Events: evs})
		if err != nil {
			r.failf("backend: %v", err)
		}
		r.same("inserted", res, m.Insert(mevs...))
	case "claim":
		r.claimStep(s.claim)
	case "complete":
		bt, mt := r.token(s.names[0], s.stale)
		id := r.events[s.names[0]].ID
		err := d.RunInTx(ctx, func(ctx context.Context, tx TTx) error {
			return d.CompleteInboxTx(ctx, tx, &ferrydriver.CompleteInboxParams{Group: r.group, EventID: id, Claim: bt, Keep: s.keep})
		})
		r.same("outcomes", r.lostOrNot("backend", err), r.lostOrNot("model", m.Complete(time.Now(), id, mt, s.keep)))
	case "fail":
		bt, mt := r.token(s.names[0], s.stale)
		id := r.events[s.names[0]].ID
		retry := time.Now().Add(time.Hour)
		if s.due {
			retry = time.Now().Add(-time.Second)
		}
		err := d.FailInbox(ctx, &ferrydriver.FailInboxParams{Group: r.group, EventID: id, Claim: bt, Error: "failed in step " + r.desc,
			RetryAt: retry, Dead: s.dead, Uncounted: s.uncounted})
		merr := m.Fail(time.Now(), inboxmodel.FailParams{ID: id, Claim: mt, Error: "failed in step " + r.desc, RetryAt: retry, Dead: s.dead, Uncounted: s.uncounted})
		r.same("outcomes", r.lostOrNot("backend", err), r.lostOrNot("model", merr))
	case "redrive", "discard":
		ids := r.ids(s.names)
		p := &ferrydriver.InboxIDsParams{Group: r.group, EventIDs: ids}
		var n, mn int
		var err error
		if s.op == "redrive" {
			n, err = d.RedriveInbox(ctx, p)
			mn = m.Redrive(ids...)
		} else {
			n, err = d.DiscardInbox(ctx, p)
			mn = m.Discard(ids...)
		}
		if err != nil {
			r.failf("backend: %v", err)
		}
		r.same("rows changed", n, mn)
	case "retract":
		var rs []ferrydriver.Retraction
		var mrs []inboxmodel.Retraction
		for _, n := range s.names {
			n, comp, _ := strings.Cut(n, ">")
			key := "ghosts"
			if ev, ok := r.events[n]; ok {
				key = ev.Key
			}
			x := ferrydriver.Retraction{Event: r.event(n, key)}
			mx := inboxmodel.Retraction{Event: r.mevent(x.Event)}
			if comp != "" {
				x.Compensation = r.event(comp, key)
				c := r.mevent(x.Compensation)
				mx.Compensation = &c
			}
			rs, mrs = append(rs, x), append(mrs, mx)
		}
		res, err := d.RetractInbox(ctx, &ferrydriver.RetractInboxParams{Group: r.group, Retractions: rs})
		if err != nil {
			r.failf("backend: %v", err)
		}
		r.same("prior states", res, m.Retract(mrs...))
	case "policy":
		if err := d.SetInboxPolicy(ctx, &ferrydriver.InboxPolicyParams{Group: r.group, HoldDead: s.hold}); err != nil {
			r.failf("backend: %v", err)
		}
		m.SetPolicy(s.hold)
	case "expire":
		// Past the model's expiry, which is never before the backend's;
		// longer is always safe.
		time.Sleep(time.Until(r.expiry.Add(250 * time.Millisecond)))
		r.unwaited = false
	case "reap":
		holders, err := d.ClaimHolders(ctx, r.group)
		if err != nil {
			r.failf("backend: %v", err)
		}
		slices.Sort(holders)
		r.same("claim holders before", holders, m.ClaimHolders(time.Now()))
		n, err := d.ExpireClaims(ctx, &ferrydriver.ExpireClaimsParams{Group: r.group, Worker: s.worker})
		if err != nil {
			r.failf("backend: %v", err)
		}
		r.same("claims ended", n, m.ExpireClaims(time.Now(), s.worker))
		holders, err = d.ClaimHolders(ctx, r.group)
		if err != nil {
			r.failf("backend: %v", err)
		}
		slices.Sort(holders)
		r.same("claim holders after", holders, m.ClaimHolders(time.Now()))
	default:
		r.failf("unknown step")
	}
	if !r.unwaited {
		due, err := d.RescueDue(ctx, r.group)
		if err != nil {
			r.failf("backend: %v", err)
		}
		r.same("rescue due", due, m.RescueDue(time.Now()))
	}
}

// claimStep claims on the backend, then has the model claim the keys the
// backend chose, in its order: each must be one the model would take, the
// rows claimed of each the same, and no key the model would take left
// while the claim had room for it.
func (r *mrun[TTx]) claimStep(c mclaim) {
	r.t.Helper()
	ttl := modelLiveTTL
	if c.Short {
		ttl = modelShortTTL
	}
	rows, err := r.d.ClaimInbox(r.ctx, &ferrydriver.ClaimInboxParams{Group: r.group, Worker: c.Worker, Limit: c.Limit, Keys: c.Keys,
		PerKey: c.PerKey, TTL: ttl, MaxAttempts: c.MaxAttempts, Rescue: c.Rescue})
	if err != nil {
		r.failf("backend: %v", err)
	}
	now := time.Now()
	p := inboxmodel.ClaimParams{Worker: c.Worker, Limit: c.Limit, Keys: c.Keys, PerKey: c.PerKey, TTL: ttl, MaxAttempts: c.MaxAttempts, Rescue: c.Rescue}
	var keys, got []string
	for i, row := range rows {
		n := r.name(row.Event.ID)
		if k := row.Event.Key; !slices.Contains(keys, k) {
			keys = append(keys, k)
		} else if rows[i-1].Event.Key != k {
			r.failf("the backend's claim is not grouped by key: %v", describeRows(r, rows))
		}
		got = append(got, fmt.Sprintf("%s:%s:%d", n, row.State, row.Attempts))
		switch row.State {
		case ferrydriver.InboxProcessing:
			if row.Claim == "" {
				r.failf("claimed %s has no claim", n)
			}
			r.claims[n] = append(r.claims[n], row.Claim)
		case ferrydriver.InboxDead:
			if row.Claim != "" || !strings.Contains(row.LastError, ferrydriver.ReasonAttemptsExhausted) {
				r.failf("%s returned DEAD with claim %q and error %q, want none and %q", n, row.Claim, row.LastError, ferrydriver.ReasonAttemptsExhausted)
			}
		default:
			r.failf("claim returned %s in state %s", n, row.State)
		}
	}
	heads := func() []string {
		var out []string
		for _, k := range r.m.Candidates(now, p) {
			out = append(out, r.name(r.m.Head(k).ID))
		}
		return out
	}
	before := heads()
	mrows, err := r.m.Claim(now, p, keys...)
	if err != nil {
		r.failf("claimed rows differ:\n  backend: %v\n  model:   runnable heads %v, limit %d keys, %d rows (%v)",
			got, before, inboxmodel.ClaimLimit(p), max(c.Limit, 1), err)
	}
	var mgot []string
	for _, row := range mrows {
		n := r.name(row.ID)
		mgot = append(mgot, fmt.Sprintf("%s:%s:%d", n, row.State, row.Attempts))
		if row.State == ferrydriver.InboxProcessing {
			r.mclaims[n] = append(r.mclaims[n], row.Claim)
			if c.Short {
				r.expiry, r.unwaited = row.ClaimExpires, true
			}
		}
	}
	r.same("claimed rows", got, mgot)
	if left := heads(); len(left) > 0 && len(keys) < inboxmodel.ClaimLimit(p) && len(rows) < max(c.Limit, 1) {
		r.failf("claimed rows differ:\n  backend: %v\n  model:   also %v, within the limit of %d keys, %d rows (runnable heads %v)",
			got, left, inboxmodel.ClaimLimit(p), max(c.Limit, 1), before)
	}
}

func describeRows[TTx any](r *mrun[TTx], rows []*ferrydriver.InboxRow) []string {
	out := make([]string, len(rows))
	for i, row := range rows {
		out[i] = fmt.Sprintf("%s:%s:%d", r.name(row.Event.ID), row.State, row.Attempts)
	}
	return out
}

// compareRows compares every row's state and attempts, in the order the
// events were named.
func (r *mrun[TTx]) compareRows() {
	r.t.Helper()
	states, err := r.d.InboxStates(r.ctx, &ferrydriver.InboxIDsParams{Group: r.group, EventIDs: r.ids(r.order)})
	if err != nil {
		r.failf("backend: read the states: %v", err)
	}
	var backend, model []string
	for _, n := range r.order {
		id := r.events[n].ID
		if row, ok := states[id]; ok {
			backend = append(backend, fmt.Sprintf("%s:%s:%d", n, row.State, row.Attempts))
		} else {
			backend = append(backend, n+":absent")
		}
		if row, ok := r.m.Row(id); ok {
			model = append(model, fmt.Sprintf("%s:%s:%d", n, row.State, row.Attempts))
		} else {
			model = append(model, n+":absent")
		}
	}
	r.same("rows", backend, model)
}
