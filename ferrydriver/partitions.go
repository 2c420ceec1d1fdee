package ferrydriver

import (
	"context"
	"errors"
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
// (a relay that has not run).
func RelayFeeds(ctx context.Context, s Store, filter string) ([]string, error) {
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
