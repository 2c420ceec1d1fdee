// Package driverkit holds what Ferry's backends and operator tools share
// to use the ferrydriver seam alike (relay feed names and filters, inbox
// cursors, message texts, lag estimates, ID parsing) and that is not part
// of the seam itself. It carries no compatibility promise: a backend
// outside this repository should not import it.
package driverkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// The bounds every backend keeps, as the ferrydriver seam documents them.
const (
	// AttemptHistory bounds a row's history (Admin.InboxAttempts): the
	// oldest entries go first.
	AttemptHistory = 20
	// AttemptErrorChars bounds the error text of one history entry
	// (AttemptRecord.Error).
	AttemptErrorChars = 2048
	// MaxListedGroups bounds Admin.InboxGroups.
	MaxListedGroups = 1000
)

// ErrCursorNeedsFinishedStates is ListInbox's refusal of After with an
// unfinished state (CheckInboxCursor).
var ErrCursorNeedsFinishedStates = errors.New("a page after a cursor lists finished states only (dead, processed, discarded, retracted)")

// ExtrapolateLag is the estimate behind FeedLag.Events, for backends:
// counted events were found after position from, up to and including
// position last, when counting stopped at ferrydriver.ExactCountLimit;
// head is the position of the partition's newest event. Below the limit, or when
// last is the head, the count is exact and returned as is.
func ExtrapolateLag(counted int64, from, last, head float64) (events int64, estimated bool) {
	if counted < ferrydriver.ExactCountLimit || head <= last || last <= from {
		return counted, false
	}
	return int64(float64(counted) * (head - from) / (last - from)), true
}

// ParseIDList parses event IDs joined by commas ("" is none), as backends
// that aggregate them in SQL return them.
func ParseIDList(s string) ([]uuid.UUID, error) {
	if s == "" {
		return nil, nil
	}
	return ParseIDs(strings.Split(s, ","))
}

// ParseIDs parses event IDs as text.
func ParseIDs(ids []string) ([]uuid.UUID, error) {
	out := make([]uuid.UUID, len(ids))
	for i, p := range ids {
		id, err := uuid.Parse(p)
		if err != nil {
			return nil, fmt.Errorf("event ID %q: %w", p, err)
		}
		out[i] = id
	}
	return out, nil
}

// IsRelayLease reports whether a lease is held by a relay process: a
// feed's ("<feed>/<partition>", see FeedPartition) or a ferry.Balancer
// membership ("members/<feed>/<holder>"). SetPartitions refuses while one
// is live.
func IsRelayLease(name string) bool {
	if _, ok := FeedPartition(name); ok {
		return true
	}
	return strings.HasPrefix(name, "members/")
}

// CountStore names, in a backend's errors, where the partition count is
// stored, so that every backend words its refusals alike.
type CountStore struct {
	Driver string // the backend's package: "ferrypg"
	Kind   string // "schema" or "database"
	Name   string // as the message shows it (quoted, if need be)
}

// Mismatch is the error of op, by a process configured with configured
// partitions where stored are stored.
func (w CountStore) Mismatch(op string, configured, stored int) error {
	return fmt.Errorf("%s: %s: %w: Config.Partitions (--partitions / FERRY_PARTITIONS) is %d but %s %s stores %d partition(s): "+
		"set it to %d, or to 0 to follow the %s; to change the %s's count use `ferry partitions set` (Driver.SetPartitions)",
		w.Driver, op, ferrydriver.ErrMisconfigured, configured, w.Kind, w.Name, stored, stored, w.Kind, w.Kind)
}

// CheckFeed refuses op on a feed of partition by a process configured with
// another count than the stored one (configured 0 follows it), or of a
// partition outside the stored range.
func (w CountStore) CheckFeed(op string, configured, stored, partition int) error {
	if configured > 0 && configured != stored {
		return w.Mismatch(op, configured, stored)
	}
	if partition < 0 || partition >= stored {
		return fmt.Errorf("%s: %s: %w: partition %d is out of range: %s %s stores %d partition(s), numbered from 0; "+
			"set RelayConfig.Partition (--partition / FERRY_PARTITION) below %d, or change the count with `ferry partitions set`",
			w.Driver, op, ferrydriver.ErrMisconfigured, partition, w.Kind, w.Name, stored, stored)
	}
	return nil
}

// PartitionChangeRefused is the error a backend's SetPartitions returns
// when problems (the texts below, and the backend's own) make changing
// the count now unsafe: it wraps ferrydriver.ErrPartitionChangeUnsafe and says what
// to do. prefix names the backend ("ferrypg"), op the change asked for.
func PartitionChangeRefused(prefix, op string, problems []string) error {
	return fmt.Errorf("%s: %s: %w: %s. Stop the producers, let every relay run until `ferry status` shows no lag, "+
		"stop the relays (they release their leases) and run this again; then start the relays, and the producers "+
		"(those with Config.Partitions 0 follow the new count, others need it set)",
		prefix, op, ferrydriver.ErrPartitionChangeUnsafe, strings.Join(problems, "; "))
}

// LeaseHeldProblem is the problem of a relay holding a lease; until says
// when it expires, in the backend's words.
func LeaseHeldProblem(holder, lease, until string) string {
	return fmt.Sprintf("relay %s holds lease %s (%s)", holder, lease, until)
}

// ParkedProblem is the problem of a feed with n parked events.
func ParkedProblem(feed string, n int64) string {
	return fmt.Sprintf("feed %s has %d parked event(s) of stuck keys, not delivered yet", feed, n)
}

// UnreadPartitionProblem is the problem of a partition with events that no
// feed has a checkpoint for.
func UnreadPartitionProblem(partition int) string {
	return fmt.Sprintf("partition %d has events and no feed has read it", partition)
}

// InFeed reports whether filter (ferrydriver.ListDeadLettersParams.Feed)
// selects the feed partition named feed: an empty filter selects every feed, a
// partition's name ("hooks/0", see FeedPartition) that partition, and a
// feed's name ("hooks") each of its partitions ("hooks/0", "hooks/1", ...).
func InFeed(filter, feed string) bool {
	exact, family := FeedFilter(filter)
	switch {
	case exact != "":
		return feed == exact
	case family != "":
		rest, ok := strings.CutPrefix(feed, family)
		return ok && rest != "" && strings.Trim(rest, "0123456789") == ""
	}
	return true
}

// FeedFilter splits a feed filter (ferrydriver.ListDeadLettersParams.Feed)
// for a store's query: a partition's name is matched exactly (exact), a feed's
// name as the prefix family ("hooks/") followed by a partition number.
// At most one of them is set; neither when filter is "" (every feed).
func FeedFilter(filter string) (exact, family string) {
	switch {
	case filter == "":
		return "", ""
	case isPartitionName(filter):
		return filter, ""
	}
	return "", filter + "/"
}

// isPartitionName reports whether name ends in "/<digits>": a relay
// feed's partition ("<feed>/<partition>"), not a feed's name.
func isPartitionName(name string) bool {
	i := strings.LastIndexByte(name, '/')
	return i > 0 && i < len(name)-1 && strings.Trim(name[i+1:], "0123456789") == ""
}

// Refs returns the dead letters' references.
func Refs(dls []*ferrydriver.DeadLetter) []ferrydriver.DeadLetterRef {
	out := make([]ferrydriver.DeadLetterRef, len(dls))
	for i, dl := range dls {
		out[i] = ferrydriver.DeadLetterRef{Feed: dl.Feed, EventID: dl.Event.ID}
	}
	return out
}

// FeedPartition returns the partition of a relay feed name: relays name
// their feed (checkpoint and lease) "<feed>/<partition>" (ferry.Relay).
// Other names (a chain source's "chain/<name>") report false.
func FeedPartition(name string) (int, bool) {
	i := len(name)
	for i > 0 && name[i-1] >= '0' && name[i-1] <= '9' {
		i--
	}
	if i == len(name) || i < 2 || name[i-1] != '/' || len(name)-i > 4 {
		return 0, false
	}
	n := 0
	for _, c := range name[i:] {
		n = n*10 + int(c-'0')
	}
	if n >= ferrydriver.MaxPartitions || (len(name)-i > 1 && name[i] == '0') {
		return 0, false
	}
	return n, true
}

// notFeeds are the prefixes of the lease and checkpoint names that are
// not relay feeds: a ferry.Balancer's memberships, a chain source's
// cursor and lease, a consumer group's gauge lease.
var notFeeds = []string{"members/", "chain/", "consumer-gauges/"}

// IsFeedName reports whether name is a relay feed partition's
// ("<feed>/<partition>"), and not another lease's or checkpoint's.
func IsFeedName(name string) bool {
	if _, ok := FeedPartition(name); !ok {
		return false
	}
	for _, p := range notFeeds {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
}

// RelayFeeds returns the relay feed partitions an operator's view shows,
// in name order: every partition (of the stored count) of each feed the
// store knows of (ListFeeds), and any other partition of theirs it knows
// of (one beyond a count since lowered); feed "default"'s when it knows
// none. filter narrows them as ferrydriver.ListDeadLettersParams.Feed
// does; a feed or partition it names is shown even if the store knows
// nothing of it yet (a relay that has not run).
func RelayFeeds(ctx context.Context, s ferrydriver.Store, filter string) ([]string, error) {
	names, err := s.ListFeeds(ctx)
	if err != nil {
		return nil, err
	}
	partitions, err := s.StoredPartitions(ctx)
	if err != nil {
		return nil, err
	}
	families := map[string]bool{}
	seen := map[string]bool{}
	for _, n := range names {
		if IsFeedName(n) {
			seen[n] = true
			families[n[:strings.LastIndexByte(n, '/')]] = true
		}
	}
	exact, family := FeedFilter(filter)
	switch {
	case exact != "":
		seen[exact] = true
	case family != "":
		families[strings.TrimSuffix(family, "/")] = true
	case len(families) == 0:
		families["default"] = true
	}
	for f := range families {
		for p := range partitions {
			seen[f+"/"+strconv.Itoa(p)] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		if InFeed(filter, n) {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, compareFeeds)
	return out, nil
}

// compareFeeds orders feed partitions by feed, then partition number.
func compareFeeds(a, b string) int {
	fa, pa := splitFeed(a)
	fb, pb := splitFeed(b)
	if c := strings.Compare(fa, fb); c != 0 {
		return c
	}
	return pa - pb
}

func splitFeed(name string) (string, int) {
	p, _ := FeedPartition(name)
	return name[:strings.LastIndexByte(name, '/')], p
}

// InboxCursorOf is the cursor after row.
func InboxCursorOf(row *ferrydriver.InboxRow) *ferrydriver.InboxCursor {
	return &ferrydriver.InboxCursor{FinishedAt: row.FinishedAt, ReceivedAt: row.ReceivedAt, EventID: row.Event.ID}
}

// CheckInboxCursor returns ErrCursorNeedsFinishedStates when
// p has a cursor and a state that is not finished (no states means DEAD).
func CheckInboxCursor(p *ferrydriver.ListInboxParams) error {
	if p.After == nil {
		return nil
	}
	for _, s := range p.States {
		if !s.Finished() {
			return fmt.Errorf("ferrydriver: list inbox of group %s: state %s: %w", p.Group, s, ErrCursorNeedsFinishedStates)
		}
	}
	return nil
}
