package ferrydriver

import (
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

// DeadLetter is an event the relay could not publish.
type DeadLetter struct {
	Feed     string
	Event    ferryevent.Event
	Reason   string
	FailedAt time.Time
}

// InsertDeadLettersParams store dead letters under a lease.
type InsertDeadLettersParams struct {
	Feed        string
	Holder      string
	Term        int64
	DeadLetters []*DeadLetter
}

// ListDeadLettersParams filter dead letters.
type ListDeadLettersParams struct {
	// Feed, when set, limits the list to a feed: a feed's name ("hooks")
	// selects every partition of it ("hooks/0", "hooks/1", ...), a
	// partition's name ("hooks/0") that partition only.
	Feed string
	// Key, Type and Topic filter exactly when set.
	Key, Type, Topic string
	// Reason, when set, selects the dead letters whose reason contains it.
	Reason string
	// Since and Until bound FailedAt when set.
	Since, Until time.Time
	// EventIDs, when set, selects only these events.
	EventIDs []uuid.UUID
	// After, when set, continues a list after that dead letter, in the
	// list's order (FailedAt descending, then event ID): the next page.
	After *DeadLetterCursor
	// Limit caps the result; 0 means 100.
	Limit int
}

// DeadLetterCursor is a place in a list of dead letters: the last one a
// page showed.
type DeadLetterCursor struct {
	FailedAt time.Time
	EventID  uuid.UUID
}

// DeadLetterRef names one relay dead letter: the feed (partition) that
// dead-lettered the event, and the event. An event dead-lettered by
// several feeds has a dead letter in each.
type DeadLetterRef struct {
	Feed    string
	EventID uuid.UUID
}

// DeleteDeadLettersParams bound the retention of dead letters.
type DeleteDeadLettersParams struct {
	Feed      string
	OlderThan time.Duration
	// Limit caps the dead letters removed; 0 means 10,000.
	Limit int
}

// ReasonsParams bound a grouping by reason.
type ReasonsParams struct {
	Feed  string // dead letters of one feed or partition, when set
	Group string // the consumer group (InboxDeadReasons)
	// Scan is how many of the newest rows are read: 0 means
	// DefaultReasonScan.
	Scan int
	// IDs is how many event IDs each reason keeps, newest first: 0 means
	// none. Bounds applies the defaults.
	IDs int
	// Limit caps the reasons returned (those with the most rows first);
	// 0 means 100.
	Limit int
}

// Bounds returns p's scan, IDs per reason and limit, defaults applied.
func (p *ReasonsParams) Bounds() (scan, ids, limit int) {
	scan, ids, limit = p.Scan, max(p.IDs, 0), p.Limit
	if scan <= 0 {
		scan = DefaultReasonScan
	}
	if limit <= 0 {
		limit = 100
	}
	return scan, ids, limit
}

// DefaultReasonScan is how many of the newest failures a grouping by
// reason reads by default.
const DefaultReasonScan = 10_000

// Reasons is a grouping by reason of the newest failures.
type Reasons struct {
	// Scanned is how many rows were read: Scan when older ones exist
	// that were not.
	Scanned int
	// Groups has the reasons with the most rows first (then the latest).
	Groups []ReasonGroup
}

// ReasonGroup is the failures of one reason among those read: for relay
// dead letters, those of one feed partition (Feed), so that an action on
// the group's events names each dead letter with its feed.
type ReasonGroup struct {
	Feed     string // relay dead letters: the feed partition; "" for a group's
	Reason   string
	Count    int
	Latest   time.Time
	EventIDs []uuid.UUID // newest first, at most ReasonsParams.IDs
}
