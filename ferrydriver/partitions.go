package ferrydriver

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
)

// MaxPartitions is the largest partition count a backend accepts.
const MaxPartitions = 4096

// ErrPartitionChangeUnsafe is returned (wrapped) by SetPartitions when
// changing the count now could deliver a key's events out of order: a
// relay still holds a feed, or a feed has not delivered every event. The
// wrapping error names the feed and says what to do; the change can be
// asked for again once it is safe.
var ErrPartitionChangeUnsafe = errors.New("changing the partition count now could reorder a key's events")

// PartitionOf returns the outbox partition of key among partitions:
// FNV-1a (32 bits) of the key's bytes modulo partitions. Every backend
// uses it, so that the mapping is the same whatever the database.
func PartitionOf(key string, partitions int) int {
	if partitions <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(partitions))
}

// PartitionStore is implemented by stores that keep the outbox's partition
// count with the schema (written when the schema is migrated) and hold
// every producer and relay to it.
//
// A backend that implements it refuses, with an error wrapping
// ErrMisconfigured, a feed or an append by a process configured with
// another count, and an OpenFeed of a partition outside the stored range.
type PartitionStore interface {
	// StoredPartitions returns the partition count stored with the schema.
	StoredPartitions(ctx context.Context) (int, error)
	// SetPartitions changes the stored count. It refuses with
	// ErrPartitionChangeUnsafe unless no relay holds a feed of the outbox
	// and every feed has delivered every event of its partition (a Parker's
	// parked events are not delivered, though the checkpoint passed them):
	// then no
	// event written under the old count can be delivered after one written
	// under the new count, whose key may map to another partition.
	// Producers are held back while the change is checked and made.
	SetPartitions(ctx context.Context, p *SetPartitionsParams) (*SetPartitionsResult, error)
}

// SetPartitionsParams ask for a new partition count.
type SetPartitionsParams struct {
	// Partitions is the new count, 1 to MaxPartitions.
	Partitions int
	// Force records the count without the safety checks. It is for
	// correcting a stored count that does not describe what producers
	// already write (for instance one inferred by the migration of an
	// older schema), never for changing the count of a live outbox.
	Force bool
}

// SetPartitionsResult reports a change.
type SetPartitionsResult struct {
	// Previous is the count stored before the call.
	Previous int
	// Partitions is the count stored now.
	Partitions int
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
	if n >= MaxPartitions || (len(name)-i > 1 && name[i] == '0') {
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
// none. filter narrows them as ListDeadLettersParams.Feed does; a feed or
// partition it names is shown even if the store knows nothing of it yet
// (a relay that has not run). A store that is not a PartitionStore has
// one partition.
func RelayFeeds(ctx context.Context, s Store, filter string) ([]string, error) {
	names, err := s.ListFeeds(ctx)
	if err != nil {
		return nil, err
	}
	partitions := 1
	if ps, ok := s.(PartitionStore); ok {
		if partitions, err = ps.StoredPartitions(ctx); err != nil {
			return nil, err
		}
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
// stored, so that every backend words the refusals of PartitionStore alike.
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
		w.Driver, op, ErrMisconfigured, configured, w.Kind, w.Name, stored, stored, w.Kind, w.Kind)
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
			w.Driver, op, ErrMisconfigured, partition, w.Kind, w.Name, stored, stored)
	}
	return nil
}

// PartitionChangeRefused is the error a backend's SetPartitions returns
// when problems (the texts below, and the backend's own) make changing
// the count now unsafe: it wraps ErrPartitionChangeUnsafe and says what
// to do. prefix names the backend ("ferrypg"), op the change asked for.
func PartitionChangeRefused(prefix, op string, problems []string) error {
	return fmt.Errorf("%s: %s: %w: %s. Stop the producers, let every relay run until `ferry status` shows no lag, "+
		"stop the relays (they release their leases) and run this again; then start the relays, and the producers "+
		"(those with Config.Partitions 0 follow the new count, others need it set)",
		prefix, op, ErrPartitionChangeUnsafe, strings.Join(problems, "; "))
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
