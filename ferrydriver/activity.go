package ferrydriver

import (
	"time"
)

// ActivityListCap bounds ListActivity: about an hour of 10-second samples
// of 25 components and processes.
const ActivityListCap = 10_000

// Activity kinds: what recorded a sample.
const (
	// ActivityRelay is a relay's sample; its Name is the feed and
	// partition ("default/0").
	ActivityRelay = "relay"
	// ActivityConsumer is a consumer's sample; its Name is the group.
	ActivityConsumer = "consumer"
)

// ActivitySample is what one component (a relay of a feed partition, a
// consumer of a group) in one process did in one interval, which ends at
// At.
type ActivitySample struct {
	Kind    string
	Name    string
	Process string
	At      time.Time
	// Interval is the sample's length.
	Interval time.Duration
	// Done counts the events published (relay) or applied (consumer) in
	// the interval.
	Done int64
	// Failed counts failed attempts (a publish to retry, a handler's
	// error); Dead the events that went to the dead letters.
	Failed, Dead int64
	// LatencyP50 and LatencyP99 are, of the events done in the interval,
	// the time from their creation (Event.CreatedAt, the producer's emit)
	// to their publish acknowledgement (relay) or to the commit that
	// applied them (consumer). Zero when none was done.
	LatencyP50, LatencyP99 time.Duration
	// HandlerP50 and HandlerP99 are a consumer's handler transactions'
	// time per event, begin to commit. Zero for relays.
	HandlerP50, HandlerP99 time.Duration
	// LagEvents and LagAge are a relay's feed lag (FeedLag) as it last
	// read it in the interval: the events committed that its checkpoint
	// has not passed, and the age of the oldest unpublished one. Zero for
	// consumers, and for a relay that did not lead its feed.
	LagEvents int64
	LagAge    time.Duration
}

// RecordActivityParams are samples to store.
type RecordActivityParams struct {
	Samples []*ActivitySample
	// Retention is how long samples are kept; 0: DefaultActivityRetention.
	Retention time.Duration
}

// DefaultActivityRetention is how long samples are kept by default.
const DefaultActivityRetention = 24 * time.Hour

// ListActivityParams select samples.
type ListActivityParams struct {
	Since time.Time
	// Kind and Name select exactly when set.
	Kind, Name string
	Limit      int
}
