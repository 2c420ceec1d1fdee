// Package uiapi holds the JSON requests and responses of the console's
// HTTP API (ferryui.Handler under /api/v1/): what a client of the API, or a
// test of a backend's console, reads and writes. ferryui serves them.
package uiapi

import (
	"time"
)

// ActivityJSON is GET /api/v1/activity: what the relays and consumer
// groups did over a window, one series per component (a relay's feed
// partition, a group), from the samples every running relay and consumer
// records (ferrydriver.Admin), its processes summed per step.
type ActivityJSON struct {
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// StepSeconds is the width of a point.
	StepSeconds float64          `json:"step_seconds"`
	Series      []ActivitySeries `json:"series"`
	// Recorded says whether the backends keep activity at all (false: no
	// series can come).
	Recorded bool `json:"recorded"`
}

// ActivitySeries is one component's points, oldest first; a step with no
// sample is absent (nothing of it ran, or it recorded nothing).
type ActivitySeries struct {
	Kind   string          `json:"kind"` // "relay" or "consumer"
	Name   string          `json:"name"`
	Points []ActivityPoint `json:"points"`
	// Total sums the window's points.
	Total ActivityPoint `json:"total"`
}

// ActivityPoint is one step of a series. Rates are per second of the
// step; latencies, in seconds, are of the events done in it: p50 the
// mean of the processes' medians weighted by what each did, p99 the
// largest of their p99s.
type ActivityPoint struct {
	At              time.Time `json:"at"`
	Done            int64     `json:"done"`
	Failed          int64     `json:"failed"`
	Dead            int64     `json:"dead"`
	DonePerSecond   float64   `json:"done_per_second"`
	FailedPerSecond float64   `json:"failed_per_second"`
	LatencyP50      float64   `json:"latency_p50_seconds"`
	LatencyP99      float64   `json:"latency_p99_seconds"`
	HandlerP50      float64   `json:"handler_p50_seconds,omitempty"`
	HandlerP99      float64   `json:"handler_p99_seconds,omitempty"`
	// LagEvents and LagSeconds are a relay's feed lag, the largest its
	// samples of the step read (events its checkpoint had not passed, the
	// age of the oldest unpublished one); the total's are its last
	// point's.
	LagEvents  int64   `json:"lag_events,omitempty"`
	LagSeconds float64 `json:"lag_seconds,omitempty"`
	Processes  int     `json:"processes"`
}

// FeedJSON is one partition of a relay feed.
type FeedJSON struct {
	Feed              string     `json:"feed"`
	LagEvents         int64      `json:"lag_events"`
	LagEstimated      bool       `json:"lag_estimated"`
	OldestPending     *time.Time `json:"oldest_pending,omitempty"`
	LagSeconds        float64    `json:"lag_seconds"`
	CheckpointAt      *time.Time `json:"checkpoint_at,omitempty"`
	CheckpointSeconds float64    `json:"checkpoint_age_seconds,omitempty"`
	CheckpointTerm    int64      `json:"checkpoint_term"`
	LeaseHolder       string     `json:"lease_holder,omitempty"`
	LeaseTerm         int64      `json:"lease_term,omitempty"`
	LeaseHeld         bool       `json:"lease_held"`
	DeadLetters       int64      `json:"dead_letters"`
	DeadLettersMore   bool       `json:"dead_letters_more,omitempty"`
	DatabaseNow       time.Time  `json:"database_now"`
}

// OpenTxJSON is an open database transaction (the feeds list's
// oldest_outbox_tx: the oldest that wrote to the outbox and has not
// committed; its events are published when it does).
type OpenTxJSON struct {
	PID         int       `json:"pid"`
	Started     time.Time `json:"started"`
	AgeSeconds  float64   `json:"age_seconds"`
	State       string    `json:"state,omitempty"`
	Application string    `json:"application,omitempty"`
}

// ParkedJSON is a key the relay set aside because its destination stopped
// acknowledging it, or whose redriven dead letter waits for the feed's
// relay (redriven): its first parked event, and whether the relay gave up
// retrying it (held: `ferry parked release` or skip lets it go).
type ParkedJSON struct {
	Feed     string    `json:"feed"`
	Key      string    `json:"key"`
	Held     bool      `json:"held"`
	Redriven bool      `json:"redriven,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	ParkedAt time.Time `json:"parked_at"`
	Queued   int64     `json:"queued"`
	Event    EventJSON `json:"event"`
}

// ChainJSON is a chain source's saved position: the tier it follows, the
// last block it ingested, its reorgs, when it saved, who leads it and, when
// the console can ask the node, the chain's head and the lag in blocks.
type ChainJSON struct {
	Name      string    `json:"name"`
	ChainID   uint64    `json:"chain_id"`
	Tier      string    `json:"tier"`
	Block     uint64    `json:"block"`
	Hash      string    `json:"hash"`
	Window    int       `json:"window_blocks"`
	Reorgs    uint64    `json:"reorgs"`
	SavedAt   time.Time `json:"saved_at"`
	Holder    string    `json:"lease_holder,omitempty"`
	Held      bool      `json:"lease_held"`
	Head      *uint64   `json:"head,omitempty"`
	LagBlocks *uint64   `json:"head_lag_blocks,omitempty"`
	HeadError string    `json:"head_error,omitempty"`
}

// InboxRowJSON is an event in a consumer group's inbox.
type InboxRowJSON struct {
	Group         string     `json:"group"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error,omitempty"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	ReceivedAt    time.Time  `json:"received_at"`
	FinishedAt    *time.Time `json:"finished_at,omitempty"`
	Event         EventJSON  `json:"event"`
	// History is the row's failed attempts and redrives, oldest first
	// (ferrydriver.Admin); only an event's timeline has it, and
	// only where the backend keeps it.
	History []AttemptJSON `json:"history,omitempty"`
}

// AttemptJSON is one entry of an inbox row's history: a failed attempt
// (state failed or dead, with its error) or a redrive (state pending).
type AttemptJSON struct {
	Attempt int       `json:"attempt"`
	State   string    `json:"state"`
	Error   string    `json:"error,omitempty"`
	At      time.Time `json:"at"`
}

// GroupJSON is a consumer group: its inbox rows by state (each counted to
// ferrydriver.InboxCountCap) and its stored dead policy, "hold" (a key's
// later events wait behind a DEAD one: each DEAD event holds its key) or
// "continue"; "hold" too when none is stored (no consumer of the group
// has started), as consumers then hold.
type GroupJSON struct {
	Group      string           `json:"group"`
	Counts     map[string]int64 `json:"counts"`
	DeadPolicy string           `json:"dead_policy"`
}

// PolicyRequest sets a group's dead policy: true holds a key's later
// events behind a DEAD one (ferry.Hold), false lets them run (Continue).
type PolicyRequest struct {
	HoldDead *bool `json:"hold_dead"`
}

// DeadLetterJSON is a relay dead letter.
type DeadLetterJSON struct {
	Feed     string    `json:"feed"`
	Reason   string    `json:"reason"`
	FailedAt time.Time `json:"failed_at"`
	Event    EventJSON `json:"event"`
}

// DeadLettersOfJSON is an event's relay dead letters, one per feed
// partition that dead-lettered it, newest first.
type DeadLettersOfJSON struct {
	ID          string           `json:"id"`
	DeadLetters []DeadLetterJSON `json:"dead_letters"`
}

// EndpointJSON is one path of the API, as GET /api/v1/ lists it.
type EndpointJSON struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Does   string `json:"does"`
}

// EventJSON is an event as the API shows it. Payload is base64 (JSON's
// form of bytes); PayloadText is the payload again when it is UTF-8 text.
type EventJSON struct {
	ID          string            `json:"id"`
	Topic       string            `json:"topic"`
	Key         string            `json:"key"`
	Seq         int64             `json:"seq"`
	Type        string            `json:"type"`
	Source      string            `json:"source,omitempty"`
	ContentType string            `json:"content_type,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	Payload     []byte            `json:"payload"`
	PayloadText *string           `json:"payload_text,omitempty"`
}

// Filter selects events by the fields that are set, failed (or finished)
// in [Since, Until). Feed is a feed's name ("hooks": every partition of
// it) or a partition's ("hooks/0"); Topic and Reason (a text the reason
// contains) select relay dead letters only.
type Filter struct {
	Feed   string    `json:"feed,omitempty"`
	Key    string    `json:"key,omitempty"`
	Type   string    `json:"type,omitempty"`
	Topic  string    `json:"topic,omitempty"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since,omitzero"`
	Until  time.Time `json:"until,omitzero"`
	Limit  int       `json:"limit,omitempty"`
}

// ActionRequest selects what an action acts on: a group's events by ID
// (IDs), relay dead letters each by its feed and event (Letters: an
// event dead-lettered by several feeds has a dead letter in each, and an
// action reaches only those named), or every one matching Filter (at
// most Filter.Limit). DryRun counts them and acts on none; Expect, when
// set, makes the action refuse unless it would act on exactly that many
// (the count a dry run showed).
type ActionRequest struct {
	IDs     []string    `json:"ids,omitempty"`
	Letters []LetterRef `json:"letters,omitempty"`
	Filter  *Filter     `json:"filter,omitempty"`
	DryRun  bool        `json:"dry_run,omitempty"`
	Expect  *int        `json:"expect,omitempty"`
}

// LetterRef names a relay dead letter: the feed partition that
// dead-lettered the event, and the event's ID.
type LetterRef struct {
	Feed string `json:"feed"`
	ID   string `json:"id"`
}

// ActionResult says how many events an action selected and acted on: IDs
// are the events selected, and Letters, for relay dead letters, each
// with its feed. An action by filter selects one page (the filter's
// limit, DefaultPage if none): More says the page was full, so more
// events may match; the same request again (a dry run to count, then the
// action) takes the next page, since the events acted on no longer match.
// The selection applies every filter in the database, the first matches
// however far back they are: a filter no index serves (a type, a topic,
// a reason) may read many rows to find them. The action acts on exactly
// what was selected, each dead letter by its feed and event.
type ActionResult struct {
	Selected int         `json:"selected"`
	Done     int         `json:"done"`
	IDs      []string    `json:"ids"`
	Letters  []LetterRef `json:"letters,omitempty"`
	DryRun   bool        `json:"dry_run,omitempty"`
	More     bool        `json:"more"`
}

// ReasonJSON is one reason among the newest failures: how many of those
// read have it, the latest, and the newest event IDs (at most MaxPage),
// which an action can take (IDs, a page at a time). For relay dead
// letters a reason is grouped per feed partition (Feed): an action names
// each of them with it.
type ReasonJSON struct {
	Feed   string    `json:"feed,omitempty"`
	Reason string    `json:"reason"`
	Count  int       `json:"count"`
	Latest time.Time `json:"latest"`
	IDs    []string  `json:"ids"`
}

// ReasonsJSON groups the newest failures by reason: Scanned of them were
// read, at most Scan (the rest, older, were not).
type ReasonsJSON struct {
	Reasons []ReasonJSON `json:"reasons"`
	Scanned int          `json:"scanned"`
	Scan    int          `json:"scan"`
}

// EventTimelineJSON is what the console knows of one event: its relay dead
// letters, one per feed partition that dead-lettered it, and its row in
// each consumer group's inbox.
type EventTimelineJSON struct {
	ID          string           `json:"id"`
	DeadLetters []DeadLetterJSON `json:"dead_letters"`
	Groups      []InboxRowJSON   `json:"groups"`
	// Outbox is set for an event the relay has not published yet, found
	// in its partition's backlog.
	Outbox *OutboxJSON `json:"outbox,omitempty"`
}

// OutboxJSON is where an event the relay has not published yet waits:
// the feed (partition) whose backlog holds it and how many events that
// feed reads before it from its checkpoint. Invalid, when set, is why the
// relay will dead-letter it instead of publishing it.
type OutboxJSON struct {
	Feed    string    `json:"feed"`
	Ahead   int       `json:"ahead"`
	Invalid string    `json:"invalid,omitempty"`
	Event   EventJSON `json:"event"`
}

// KeyJSON is where one key stands: parked or held at the relay, its relay
// dead letters, and, in each consumer group, its rows not yet finished in
// key order: those that hold it (processing, failed, dead; its head is one
// of them) and a page of the pending ones behind.
type KeyJSON struct {
	Key         string           `json:"key"`
	Parked      []ParkedJSON     `json:"parked"`
	DeadLetters []DeadLetterJSON `json:"dead_letters"`
	Groups      []KeyGroupJSON   `json:"groups"`
}

// KeyGroupJSON is a key's unfinished rows in one group; More says the page
// did not hold them all.
type KeyGroupJSON struct {
	Group  string         `json:"group"`
	Events []InboxRowJSON `json:"events"`
	More   bool           `json:"more,omitempty"`
}
