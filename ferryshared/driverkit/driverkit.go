// Package driverkit holds what Ferry's backends share to implement the
// ferrydriver seam alike (message texts, lag estimates, ID parsing) and
// that is not part of the seam itself. It carries no compatibility
// promise: a backend outside this repository should not import it.
package driverkit

import (
	"fmt"
	"github.com/google/uuid"
	"strings"

	"github.com/ferry-dev/ferry/ferrydriver"
)

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
// feed's ("<feed>/<partition>", see ferrydriver.FeedPartition) or a ferry.Balancer
// membership ("members/<feed>/<holder>"). SetPartitions refuses while one
// is live.
func IsRelayLease(name string) bool {
	if _, ok := ferrydriver.FeedPartition(name); ok {
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
