package ferrydriver

import (
	"errors"
	"hash/fnv"
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
