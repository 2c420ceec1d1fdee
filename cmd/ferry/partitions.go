package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// cmdPartitions shows or changes the outbox's partition count, which is
// stored with the schema.
func cmdPartitions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if _, err := pickSubcommand("partitions", args, []subcommand{
		{"show", "the partition count stored with the schema"},
		{"set", "set N: change it; refused until the relays have delivered everything and stopped"},
	}, stdout); err != nil {
		return err
	}
	action := args[0]
	f := newFlags("partitions "+action, stderr)
	f.AcceptArgs()
	var db dbFlags
	db.register(f)
	var force bool
	if action == "set" {
		f.Bool(&force, "force", "FERRY_PARTITIONS_FORCE", false,
			"record N without the safety checks: only to correct a stored count that does not describe what producers already write, never to change a live outbox's")
	}
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	var n int
	if action == "set" {
		if len(f.Args()) != 1 {
			return usagef("say how many: ferry partitions set N (1 to %d); --partitions / FERRY_PARTITIONS is the count this command expects now, not the new one", ferrydriver.MaxPartitions)
		}
		var err error
		if n, err = strconv.Atoi(f.Args()[0]); err != nil || n < 1 || n > ferrydriver.MaxPartitions {
			return usagef("%q is not a partition count: use 1 to %d", f.Args()[0], ferrydriver.MaxPartitions)
		}
	} else if len(f.Args()) > 0 {
		return usagef("ferry partitions show takes no arguments (to change the count: ferry partitions set N)")
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	if action == "show" {
		stored, err := b.store.StoredPartitions(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s has %d partition(s); `ferry run` runs one relay per partition\n", b.label, stored)
		return nil
	}
	prev, err := b.store.SetPartitions(ctx, &ferrydriver.SetPartitionsParams{Partitions: n, Force: force})
	if err != nil {
		return err
	}
	if prev == n {
		fmt.Fprintf(stdout, "%s already has %d partition(s); nothing to do\n", b.label, n)
		return nil
	}
	fmt.Fprintf(stdout, "%s now has %d partition(s) (was %d): start the relays (`ferry run` runs one per partition), then the producers; "+
		"those configured with a partition count need it set to %d\n", b.label, n, prev, n)
	return nil
}

// partitionCount is the number of partitions to run relays for or report
// on: the count stored with the schema, which --partitions, when set, must
// match.
func partitionCount(ctx context.Context, b *backend, configured int) (int, error) {
	stored, err := b.store.StoredPartitions(ctx)
	if err != nil {
		return 0, err
	}
	if configured > 0 && configured != stored {
		return 0, usagef("--partitions / FERRY_PARTITIONS (database.partitions in ferry.yaml) is %d but %s has %d partition(s): leave it unset (0 follows the schema) or set it to %d; "+
			"to change the count see `ferry partitions set`", configured, b.label, stored, stored)
	}
	return stored, nil
}
