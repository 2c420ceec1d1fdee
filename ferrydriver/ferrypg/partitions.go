package ferrypg

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// StoredPartitions implements ferrydriver.Store: the partition
// count stored with the schema (migration 004).
func (d *Driver[TTx]) StoredPartitions(ctx context.Context) (int, error) {
	return d.storedPartitions(ctx, d.db)
}

func (d *Driver[TTx]) storedPartitions(ctx context.Context, e executor) (int, error) {
	var n int
	err := queryRow(ctx, e, []any{&n}, d.queries.storedPartitions)
	if isNoRows(err) {
		return 0, fmt.Errorf("ferrypg: read the partition count: %w: %s.settings has no row; restore it with `ferry partitions set N --force` (N: the count producers use)",
			ferrydriver.ErrMisconfigured, d.cfg.Schema)
	}
	if err != nil {
		return 0, d.wrapErr("read the partition count", err)
	}
	d.stored.Store(int64(n))
	return n, nil
}

// checkFeed refuses a feed of a driver configured with another count than
// the stored one, or of a partition outside the stored range.
func (d *Driver[TTx]) checkFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) error {
	stored, err := d.StoredPartitions(ctx)
	if err != nil {
		return err
	}
	return d.countStore().CheckFeed("open feed "+p.Feed, d.cfg.Partitions, stored, p.Partition)
}

// lockTimeout bounds SetPartitions' wait for producer transactions to end.
const lockTimeout = "5s"

// undeliveredLimit caps the count of undelivered events SetPartitions
// reports per feed.
const undeliveredLimit = 10000

// SetPartitions implements ferrydriver.Store.
//
// It runs in one READ COMMITTED transaction that first locks the settings
// table: that waits (up to 5 s) for every producer transaction that has
// appended, and holds new appends back until it ends; the checks that
// follow see what those transactions wrote. Then, unless p.Force, it refuses
// with ferrydriver.ErrPartitionChangeUnsafe while a relay holds a lease on
// a feed ("<feed>/<partition>"), while a feed's checkpoint has not passed
// every event of its partition or the feed has parked events (a stuck key's,
// which its checkpoint passed undelivered), or while a partition has events
// and no feed has a checkpoint for it. Otherwise it replaces the stored count.
//
// Why this keeps each key's order: every event written under the old count
// has been delivered, none can be written under it any more (see
// appendGuard and sqlTruncateSettings), and the relays, which must be
// stopped, read the new count when they start. A key that maps to another
// partition now has nothing left behind in the old one.
func (d *Driver[TTx]) SetPartitions(ctx context.Context, p *ferrydriver.SetPartitionsParams) (int, error) {
	if p.Partitions < 1 || p.Partitions > ferrydriver.MaxPartitions {
		return 0, fmt.Errorf("ferrypg: set the partition count to %d: out of range: use 1 to %d", p.Partitions, ferrydriver.MaxPartitions)
	}
	op := fmt.Sprintf("set the partition count of schema %q to %d", d.cfg.Schema, p.Partitions)
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return 0, d.wrapErr(op, err)
	}
	defer func() { _ = rollback(context.WithoutCancel(ctx)) }()
	if _, err := e.exec(ctx, sqlChangeSettingsTx); err != nil {
		return 0, d.wrapErr(op, err)
	}
	if _, err := e.exec(ctx, d.queries.lockSettings); err != nil {
		if pgErrCode(err) == "55P03" { // lock_not_available
			return 0, fmt.Errorf("ferrypg: %s: %w: a producer transaction that appended events did not end within %s; stop the producers and run this again",
				op, ferrydriver.ErrPartitionChangeUnsafe, lockTimeout)
		}
		return 0, d.wrapErr(op, err)
	}
	if _, err := e.exec(ctx, sqlIndexPlans); err != nil {
		return 0, d.wrapErr(op, err)
	}
	prev, err := d.storedPartitions(ctx, e)
	if err != nil && !(p.Force && errors.Is(err, ferrydriver.ErrMisconfigured)) {
		return 0, err
	}
	res := prev
	if !p.Force {
		problems, err := d.changeProblems(ctx, e, prev)
		if err != nil {
			return 0, d.wrapErr(op, err)
		}
		if len(problems) > 0 {
			return 0, driverkit.PartitionChangeRefused("ferrypg", op, problems)
		}
	}
	if prev == p.Partitions {
		return res, nil
	}
	if _, err := e.exec(ctx, d.queries.truncateSettings); err != nil {
		return 0, d.wrapErr(op, err)
	}
	if _, err := e.exec(ctx, d.queries.insertSettings, p.Partitions); err != nil {
		return 0, d.wrapErr(op, err)
	}
	if err := commit(ctx); err != nil {
		return 0, d.wrapErr(op+": commit", err)
	}
	d.stored.Store(int64(p.Partitions))
	return res, nil
}

// changeProblems says why changing the count now is unsafe, if it is.
func (d *Driver[TTx]) changeProblems(ctx context.Context, e executor, stored int) ([]string, error) {
	var problems []string
	r, err := e.query(ctx, d.queries.liveLeases)
	if err != nil {
		return nil, err
	}
	for r.Next() {
		var name, holder string
		var secs float64
		if err := r.Scan(&name, &holder, &secs); err != nil {
			r.Close()
			return nil, err
		}
		if driverkit.IsRelayLease(name) {
			problems = append(problems, driverkit.LeaseHeldProblem(holder, name, fmt.Sprintf("its lease expires in %.0fs", secs)))
		}
	}
	r.Close()
	if err := r.Err(); err != nil {
		return nil, err
	}

	type checkpoint struct {
		feed      string
		partition int
		cursor    []byte
	}
	var cps []checkpoint
	r, err = e.query(ctx, d.queries.allCheckpoints)
	if err != nil {
		return nil, err
	}
	for r.Next() {
		var c checkpoint
		if err := r.Scan(&c.feed, &c.partition, &c.cursor); err != nil {
			r.Close()
			return nil, err
		}
		if n, ok := driverkit.FeedPartition(c.feed); ok && n == c.partition {
			cps = append(cps, c)
		}
	}
	r.Close()
	if err := r.Err(); err != nil {
		return nil, err
	}

	var highest int
	if err := queryRow(ctx, e, []any{&highest}, d.queries.highestPartition); err != nil {
		return nil, err
	}
	read := map[int]bool{}
	for _, c := range cps {
		read[c.partition] = true
		st, err := decodeCursor(c.cursor)
		if err != nil {
			return nil, err
		}
		base, baseXip := st.CurXmax, st.CurXip
		if !st.Done {
			base, baseXip = st.PrevXmax, st.PrevXip
		}
		var n int64
		err = queryRow(ctx, e, []any{&n}, d.queries.undelivered, c.partition,
			strconv.FormatUint(base, 10), xidStrings(baseXip), st.Done, st.After,
			strconv.FormatUint(st.CurXmax, 10), xidStrings(st.CurXip), undeliveredLimit)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			problems = append(problems, fmt.Sprintf("feed %s has not delivered %s event(s) of partition %d", c.feed, countString(n), c.partition))
		}
	}
	r, err = e.query(ctx, d.queries.parkedByFeed)
	if err != nil {
		return nil, err
	}
	for r.Next() {
		var feed string
		var n int64
		if err := r.Scan(&feed, &n); err != nil {
			r.Close()
			return nil, err
		}
		problems = append(problems, driverkit.ParkedProblem(feed, n))
	}
	r.Close()
	if err := r.Err(); err != nil {
		return nil, err
	}
	for part := range max(stored, highest+1) {
		if read[part] {
			continue
		}
		var has bool
		if err := queryRow(ctx, e, []any{&has}, d.queries.partitionHasEvents, part); err != nil {
			return nil, err
		}
		if has {
			problems = append(problems, driverkit.UnreadPartitionProblem(part))
		}
	}
	return problems, nil
}

func countString(n int64) string {
	if n >= undeliveredLimit {
		return strconv.Itoa(undeliveredLimit) + "+"
	}
	return strconv.FormatInt(n, 10)
}
