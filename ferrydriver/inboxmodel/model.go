// Package inboxmodel is the consumer inbox's per-key rules written once, in
// plain Go: one consumer group's rows, key by key in the order they were
// inserted, and what each operation of ferrydriver.Inbox (and of its
// claim reaping and retraction) does to them. It keeps no
// events' contents and reads no clock: every operation that depends on
// time takes the caller's now.
//
// The backends express the same rules in SQL or in MongoDB updates; the
// behavioural suite (ferrydrivertest, ConformsToTheModel) drives a backend
// and this model side by side and fails where they part. A rule changes
// here first, and the suite tells every backend.
//
// The rules, for one key:
//
//   - The key's head is its oldest unfinished row (PENDING, PROCESSING,
//     FAILED or DEAD); under the Continue policy a DEAD row is passed over,
//     under Hold (the policy of a group with none stored) it is the head
//     and holds the rows behind it.
//   - The head is runnable when it is PENDING, FAILED and due (its retry
//     time has come), or PROCESSING with its claim expired (for a rescue
//     only); a DEAD head is never runnable. A key with a row PROCESSING
//     under a live claim runs nothing else.
//   - A claim takes runnable heads, one per key, each attempt counted at
//     the claim; a head whose attempts already reached MaxAttempts goes
//     DEAD with ReasonAttemptsExhausted instead.
//   - An ordinary claim with PerKey > 1 takes after a PENDING head the key's next PENDING rows, up
//     to PerKey rows of the key and Limit rows in all, passing DEAD rows
//     under Continue and stopping before any other row that cannot run now
//     (FAILED, PROCESSING, DEAD under Hold). A PENDING row has no
//     attempts here (inserted, redriven or given back, uncounted), so
//     none of a run's rows is spent.
//   - A finish (complete, fail) holds only under the row's current,
//     unexpired claim; otherwise the claim is lost and nothing changes. A
//     finish gives the rest of its run back, uncounted (PENDING, the
//     claim's attempt taken back), unless it completes with Keep.
//
// The model is not safe for concurrent use.
//
// The model keeps its claims on the rows; the backends keep them on the
// key's row (PostgreSQL in SQL; SQLite, MariaDB and MongoDB call the rules
// of such claims, keyclaim.go), and the conformance suite holds both to
// the same states. The rules of one key are shared code: Decide (what the
// model's claim does with a key), RunRows (which rows join a run) and
// Schedule (when a key may run next), the last two called by the
// backends' rules too. This package is internal to Ferry's backends and
// test suites in all but name: its API may change with any release.
package inboxmodel

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
)

// Row is one event's row of the group's inbox.
type Row struct {
	ID  uuid.UUID
	Key string
	// Pos is the row's place in the group (1 for the first inserted): a
	// key's rows run in Pos order.
	Pos      int
	State    ferrydriver.InboxState
	Attempts int
	// Claim, Worker and ClaimExpires describe the row's current claim
	// (PROCESSING only).
	Claim        string
	Worker       string
	ClaimExpires time.Time
	// RetryAt is when a FAILED row may run again.
	RetryAt   time.Time
	LastError string
}

// Event is what the model needs of an event: its ID and key.
type Event struct {
	ID  uuid.UUID
	Key string
}

// Inbox is one consumer group's inbox.
type Inbox struct {
	rows   []*Row // in insertion order
	byID   map[uuid.UUID]*Row
	policy *bool // the stored HoldDead; nil: none stored (holds)
	claims int   // claims made, for their tokens
}

// New returns an empty inbox with no dead policy stored.
func New() *Inbox {
	return &Inbox{byID: map[uuid.UUID]*Row{}}
}

// ErrClaimLost is returned by Complete and Fail when the claim presented
// is not the row's current, unexpired one. It wraps
// ferrydriver.ErrClaimLost.
var ErrClaimLost = fmt.Errorf("inboxmodel: %w", ferrydriver.ErrClaimLost)

// ErrNotCandidate is returned by Claim when asked for a key it would not
// claim.
var ErrNotCandidate = errors.New("inboxmodel: the key has no head this claim would take")

// Insert records events, ignoring those already recorded, and reports
// which were new.
func (m *Inbox) Insert(events ...Event) []bool {
	out := make([]bool, len(events))
	for i, ev := range events {
		if _, ok := m.byID[ev.ID]; ok {
			continue
		}
		m.add(ev, ferrydriver.InboxPending)
		out[i] = true
	}
	return out
}

func (m *Inbox) add(ev Event, state ferrydriver.InboxState) *Row {
	r := &Row{ID: ev.ID, Key: ev.Key, Pos: len(m.rows) + 1, State: state}
	m.rows = append(m.rows, r)
	m.byID[ev.ID] = r
	return r
}

// Row returns a copy of an event's row; ok is false when the group never
// received the event.
func (m *Inbox) Row(id uuid.UUID) (row Row, ok bool) {
	r, ok := m.byID[id]
	if !ok {
		return Row{}, false
	}
	return *r, true
}

// Rows returns copies of every row, in insertion order.
func (m *Inbox) Rows() []Row {
	out := make([]Row, len(m.rows))
	for i, r := range m.rows {
		out[i] = *r
	}
	return out
}

// HoldDead reports the policy in force: the stored one, or Hold when none
// is stored.
func (m *Inbox) HoldDead() bool {
	return m.policy == nil || *m.policy
}

// SetPolicy stores the group's dead policy. Every key follows it from now
// on: a DEAD row holds its key under Hold and is passed over under
// Continue.
func (m *Inbox) SetPolicy(holdDead bool) {
	m.policy = &holdDead
}

func unfinished(s ferrydriver.InboxState) bool {
	switch s {
	case ferrydriver.InboxPending, ferrydriver.InboxProcessing, ferrydriver.InboxFailed, ferrydriver.InboxDead:
		return true
	}
	return false
}

// keys returns the group's keys in the order their first rows came.
func (m *Inbox) keys() []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range m.rows {
		if !seen[r.Key] {
			seen[r.Key] = true
			out = append(out, r.Key)
		}
	}
	return out
}

// Head returns a key's head under the policy in force: its oldest
// unfinished row, DEAD rows passed over under Continue; nil when the key
// has nothing to run or hold.
func (m *Inbox) Head(key string) *Row {
	hold := m.HoldDead()
	for _, r := range m.rows {
		if r.Key != key || !unfinished(r.State) {
			continue
		}
		if r.State == ferrydriver.InboxDead && !hold {
			continue
		}
		return r
	}
	return nil
}

// busyUntil returns the latest expiry of the live claims of key's rows
// other than except at now (zero: none).
func (m *Inbox) busyUntil(key string, except *Row, now time.Time) time.Time {
	var until time.Time
	for _, r := range m.rows {
		if r != except && r.Key == key && r.State == ferrydriver.InboxProcessing && r.ClaimExpires.After(now) && r.ClaimExpires.After(until) {
			until = r.ClaimExpires
		}
	}
	return until
}

// ClaimParams are ClaimInbox's parameters that the model follows.
type ClaimParams struct {
	Worker string
	// Limit bounds the rows claimed, and the keys; Keys, when positive,
	// bounds the keys too.
	Limit, Keys int
	// PerKey bounds the rows of one key (a run: see Claim); 0 or 1: its
	// head only.
	PerKey      int
	TTL         time.Duration
	MaxAttempts int
	Rescue      bool
}

// Candidates returns, in key order of arrival, the keys whose head a claim
// with p would take at now (Decide says Take). Limit is not applied.
func (m *Inbox) Candidates(now time.Time, p ClaimParams) []string {
	var out []string
	for _, k := range m.keys() {
		if Decide(m.view(k, now), now, p.Rescue) == Take {
			out = append(out, k)
		}
	}
	return out
}

// view is what a backend reads of key at now.
func (m *Inbox) view(key string, now time.Time) KeyHead {
	h := m.Head(key)
	if h == nil {
		return KeyHead{}
	}
	return KeyHead{State: h.State, RetryAt: h.RetryAt, ClaimExpires: h.ClaimExpires, BusyUntil: m.busyUntil(key, h, now), Stale: m.stale(key, h)}
}

// KeyHead is what a backend reads of one key to decide it: its head (its
// oldest unfinished row, DEAD rows passed over under Continue; State ""
// when it has none), the head's retry time and claim expiry, and whether
// another of its rows is PROCESSING under a live claim (BusyUntil: the
// latest such claim's expiry; zero when none) or under one that expired
// (Stale).
type KeyHead struct {
	State        ferrydriver.InboxState
	RetryAt      time.Time
	ClaimExpires time.Time
	BusyUntil    time.Time
	Stale        bool
}

// Decision is what a claim does with a key.
type Decision int

const (
	// Wait: nothing of the key runs now (no head, a row under a live
	// claim, a FAILED head before its retry time, a DEAD head holding).
	Wait Decision = iota
	// Take: the claim takes the head.
	Take
	// LeaveToRescue: an expired claim is the key's (its head's, or another
	// row's behind a head redriven ahead of it): only a rescue takes the
	// head, since the expired claim's handler may still be running.
	LeaveToRescue
	// LeaveToClaim: the head is runnable, and no claim of the key expired:
	// an ordinary claim takes it, not a rescue.
	LeaveToClaim
)

// Decide is the rule of a key's head, which every backend follows: what a
// claim (a rescue when rescue) does with a key whose head is h at now.
func Decide(h KeyHead, now time.Time, rescue bool) Decision {
	if h.State == "" || !h.BusyUntil.IsZero() {
		return Wait
	}
	var runnable bool
	switch h.State {
	case ferrydriver.InboxPending:
		runnable = true
	case ferrydriver.InboxFailed:
		runnable = !h.RetryAt.After(now)
	case ferrydriver.InboxProcessing:
		runnable = !h.ClaimExpires.After(now)
	}
	expired := h.State == ferrydriver.InboxProcessing || h.Stale
	switch {
	case !runnable:
		return Wait
	case expired && !rescue:
		return LeaveToRescue
	case !expired && rescue:
		return LeaveToClaim
	}
	return Take
}

// Schedule is when a key whose head is h, read at now, may run next,
// which a backend stores with the key for its claims to find: when another
// of its rows' live claim expires, if one runs; else now for a PENDING
// head, its retry time for a FAILED one, its claim's expiry for one
// PROCESSING. A DEAD head holds the key (held) until it changes; a key
// with no head has nothing to run (neither).
func Schedule(h KeyHead, now time.Time) (at time.Time, held bool) {
	switch {
	case h.State == "":
		return time.Time{}, false
	case !h.BusyUntil.IsZero():
		return h.BusyUntil, false
	case h.State == ferrydriver.InboxDead:
		return time.Time{}, true
	case h.State == ferrydriver.InboxFailed:
		return h.RetryAt, false
	case h.State == ferrydriver.InboxProcessing:
		return h.ClaimExpires, false
	}
	return now, false
}

// RunRows returns which of the rows after a PENDING head join its run:
// next holds the states of the key's unfinished rows after the head, in
// order, and the run takes the PENDING ones, at most n, passing DEAD rows
// when the policy lets the key pass them (!hold) and stopping at any
// other row that cannot run now (FAILED, PROCESSING, DEAD holding the
// key). It returns their indexes in next.
func RunRows(next []ferrydriver.InboxState, hold bool, n int) []int {
	var out []int
	for i, st := range next {
		if len(out) >= n {
			break
		}
		if st == ferrydriver.InboxDead && !hold {
			continue
		}
		if st != ferrydriver.InboxPending {
			break
		}
		out = append(out, i)
	}
	return out
}

// stale reports whether a row of key other than except is PROCESSING
// (under a claim that expired, when busyUntil finds no live one).
func (m *Inbox) stale(key string, except *Row) bool {
	for _, r := range m.rows {
		if r != except && r.Key == key && r.State == ferrydriver.InboxProcessing {
			return true
		}
	}
	return false
}

// ClaimLimit is how many keys a claim with p takes at most: Limit (at
// least 1), and Keys when positive. Limit bounds the rows too.
func ClaimLimit(p ClaimParams) int {
	n := max(p.Limit, 1)
	if p.Keys > 0 {
		n = min(n, p.Keys)
	}
	return n
}

// Claim claims heads (and runs, with p.PerKey) at now, as ClaimInbox
// with p: of the keys given (each must be one of Candidates:
// ErrNotCandidate otherwise, and nothing changes), or else of the first
// candidates up to the limit. Each row claimed becomes PROCESSING for
// p.Worker until now+p.TTL under one token for the call, its attempt
// counted; a head whose attempts already reached p.MaxAttempts goes DEAD
// with ReasonAttemptsExhausted instead (and counts toward Limit). A key
// given that the rows claimed before it leave no room for is refused. It
// returns copies of the rows, key by key, each key's in order.
func (m *Inbox) Claim(now time.Time, p ClaimParams, keys ...string) ([]Row, error) {
	cands := m.Candidates(now, p)
	if keys == nil {
		keys = cands[:min(len(cands), ClaimLimit(p))]
		if p.PerKey > 1 {
			keys = m.fitting(p, keys)
		}
	}
	if len(keys) > ClaimLimit(p) {
		return nil, fmt.Errorf("inboxmodel: %d keys asked for, the claim takes at most %d", len(keys), ClaimLimit(p))
	}
	for i, k := range keys {
		if !slices.Contains(cands, k) {
			return nil, fmt.Errorf("key %q: %w (candidates %v)", k, ErrNotCandidate, cands)
		}
		if slices.Contains(keys[:i], k) {
			return nil, fmt.Errorf("inboxmodel: key %q asked for twice", k)
		}
	}
	if p.PerKey > 1 && len(m.fitting(p, keys)) < len(keys) {
		return nil, fmt.Errorf("inboxmodel: keys %v: the rows of the first ones fill the limit of %d rows", keys, max(p.Limit, 1))
	}
	m.claims++
	token := "model-claim-" + strconv.Itoa(m.claims)
	var out []Row
	for _, k := range keys {
		h := m.Head(k)
		if p.MaxAttempts > 0 && h.Attempts >= p.MaxAttempts {
			h.State = ferrydriver.InboxDead
			if h.LastError != "" {
				h.LastError = ferrydriver.ReasonAttemptsExhausted + " (last recorded error: " + h.LastError + ")"
			} else {
				h.LastError = ferrydriver.ReasonAttemptsExhausted
			}
			h.clearClaim()
			out = append(out, *h)
			continue
		}
		for _, r := range m.run(p, h, max(p.Limit, 1)-len(out)) {
			r.State = ferrydriver.InboxProcessing
			r.Attempts++
			r.Claim, r.Worker, r.ClaimExpires = token, p.Worker, now.Add(p.TTL)
			out = append(out, *r)
		}
	}
	return out, nil
}

// run returns the rows a claim with p takes from the key whose head is h
// (not spent), at most room: h, and with runs its key's next PENDING rows
// (RunRows).
func (m *Inbox) run(p ClaimParams, h *Row, room int) []*Row {
	out := []*Row{h}
	if p.Rescue || h.State != ferrydriver.InboxPending {
		return out
	}
	var after []*Row
	var states []ferrydriver.InboxState
	for _, r := range m.rows {
		if r.Key == h.Key && r.Pos > h.Pos && unfinished(r.State) {
			after = append(after, r)
			states = append(states, r.State)
		}
	}
	for _, i := range RunRows(states, m.HoldDead(), min(p.PerKey, room)-1) {
		out = append(out, after[i])
	}
	return out
}

// fitting returns the first of keys whose rows fit the claim's limit of
// rows, claimed in that order.
func (m *Inbox) fitting(p ClaimParams, keys []string) []string {
	room := max(p.Limit, 1)
	for i, k := range keys {
		if room <= 0 {
			return keys[:i]
		}
		h := m.Head(k)
		if p.MaxAttempts > 0 && h.Attempts >= p.MaxAttempts {
			room--
			continue
		}
		room -= len(m.run(p, h, room))
	}
	return keys
}

func (r *Row) clearClaim() {
	r.Claim, r.Worker, r.ClaimExpires = "", "", time.Time{}
}

// RescueDue reports whether a rescue has a row to claim at now: a claim
// of the group expired, on a key with no row under a live claim.
func (m *Inbox) RescueDue(now time.Time) bool {
	return len(m.Candidates(now, ClaimParams{Rescue: true})) > 0
}

// claimed returns the row of id if claim is its current claim and has not
// expired at now.
func (m *Inbox) claimed(now time.Time, id uuid.UUID, claim string) (*Row, error) {
	r, ok := m.byID[id]
	if !ok || claim == "" || r.State != ferrydriver.InboxProcessing || r.Claim != claim || !r.ClaimExpires.After(now) {
		return nil, ErrClaimLost
	}
	return r, nil
}

// Complete marks a claimed row PROCESSED at now (CompleteInboxTx). With
// keep the rest of its run stays claimed; without, it is given back.
func (m *Inbox) Complete(now time.Time, id uuid.UUID, claim string, keep bool) error {
	r, err := m.claimed(now, id, claim)
	if err != nil {
		return err
	}
	r.State = ferrydriver.InboxProcessed
	if !keep {
		m.giveBack(r)
	}
	r.clearClaim()
	return nil
}

// giveBack makes the rows after r that r's claim holds PENDING again,
// their attempts taken back.
func (m *Inbox) giveBack(r *Row) {
	for _, x := range m.rows {
		if x.Key == r.Key && x.Pos > r.Pos && x.State == ferrydriver.InboxProcessing && x.Claim == r.Claim {
			x.State = ferrydriver.InboxPending
			x.Attempts = max(x.Attempts-1, 0)
			x.clearClaim()
		}
	}
}

// FailParams are FailInbox's parameters.
type FailParams struct {
	ID        uuid.UUID
	Claim     string
	Error     string
	RetryAt   time.Time
	Dead      bool
	Uncounted bool
}

// Fail records a failed attempt at now (FailInbox): FAILED until
// p.RetryAt, or DEAD; p.Uncounted takes the claim's attempt back. The
// rest of the row's run is given back.
func (m *Inbox) Fail(now time.Time, p FailParams) error {
	r, err := m.claimed(now, p.ID, p.Claim)
	if err != nil {
		return err
	}
	m.giveBack(r)
	if p.Dead {
		r.State = ferrydriver.InboxDead
	} else {
		r.State, r.RetryAt = ferrydriver.InboxFailed, p.RetryAt
	}
	if p.Uncounted {
		r.Attempts = max(r.Attempts-1, 0)
	}
	r.LastError = p.Error
	r.clearClaim()
	return nil
}

// Redrive makes DEAD rows PENDING again, their attempts reset
// (RedriveInbox), and returns how many changed.
func (m *Inbox) Redrive(ids ...uuid.UUID) int {
	return m.fromDead(ids, ferrydriver.InboxPending)
}

// Discard gives DEAD rows up (DISCARDED: DiscardInbox) and returns how
// many changed.
func (m *Inbox) Discard(ids ...uuid.UUID) int {
	return m.fromDead(ids, ferrydriver.InboxDiscarded)
}

func (m *Inbox) fromDead(ids []uuid.UUID, to ferrydriver.InboxState) int {
	n := 0
	for _, id := range ids {
		r, ok := m.byID[id]
		if !ok || r.State != ferrydriver.InboxDead {
			continue
		}
		r.State = to
		if to == ferrydriver.InboxPending {
			r.Attempts = 0
		}
		n++
	}
	return n
}

// Retraction is one event to retract and the event that compensates it
// should the group have processed it (nil: none).
type Retraction struct {
	Event        Event
	Compensation *Event
}

// Retract marks events RETRACTED (RetractInbox) and returns each one's
// prior state ("" for an event never received, which is recorded as
// RETRACTED). A retracted row never runs and its claim, if any, is lost;
// a PROCESSED row's compensation is inserted at the end of its key.
// Retracting a row again changes nothing.
func (m *Inbox) Retract(rs ...Retraction) []ferrydriver.InboxState {
	out := make([]ferrydriver.InboxState, len(rs))
	for i, rt := range rs {
		r, ok := m.byID[rt.Event.ID]
		if !ok {
			m.add(rt.Event, ferrydriver.InboxRetracted)
			continue
		}
		out[i] = r.State
		if r.State == ferrydriver.InboxRetracted {
			continue
		}
		prior := r.State
		r.State = ferrydriver.InboxRetracted
		r.clearClaim()
		if prior == ferrydriver.InboxProcessed && rt.Compensation != nil {
			m.Insert(*rt.Compensation)
		}
	}
	return out
}

// ClaimHolders lists, sorted, the workers holding unexpired claims at now.
func (m *Inbox) ClaimHolders(now time.Time) []string {
	var out []string
	for _, r := range m.rows {
		if r.State == ferrydriver.InboxProcessing && r.ClaimExpires.After(now) && !slices.Contains(out, r.Worker) {
			out = append(out, r.Worker)
		}
	}
	slices.Sort(out)
	return out
}

// ExpireClaims makes worker's unexpired claims expire at now
// (Inbox.ExpireClaims) and returns how many it ended.
func (m *Inbox) ExpireClaims(now time.Time, worker string) int {
	n := 0
	for _, r := range m.rows {
		if r.State == ferrydriver.InboxProcessing && r.Worker == worker && r.ClaimExpires.After(now) {
			r.ClaimExpires = now
			n++
		}
	}
	return n
}
