package ferrysqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

const sqlStoredPartitions = `SELECT partitions FROM ferry_settings`

// StoredPartitions implements ferrydriver.Store: the partition
// count stored in the database (migration 004).
func (d *Driver) StoredPartitions(ctx context.Context) (int, error) {
	return d.storedPartitions(ctx, d.r)
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (d *Driver) storedPartitions(ctx context.Context, q queryRower) (int, error) {
	var n int
	err := q.QueryRowContext(ctx, sqlStoredPartitions).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("ferrysqlite: read the partition count: %w: ferry_settings in %s has no row; restore it with `ferry partitions set N --force` (N: the count producers use)",
			ferrydriver.ErrMisconfigured, d.path)
	}
	if err != nil {
		return 0, d.wrapErr("read the partition count", err)
	}
	d.stored.Store(int64(n))
	return n, nil
}

// writeCount is the partition count an append in tx computes partitions
// with: the stored one, which a driver with Config.Partitions set must
// match.
func (d *Driver) writeCount(ctx context.Context, tx *sql.Tx, op string) (int, error) {
	stored, err := d.storedPartitions(ctx, tx)
	if err != nil {
		return 0, err
	}
	if d.cfg.Partitions > 0 && d.cfg.Partitions != stored {
		return 0, d.mismatch(op, stored)
	}
	return stored, nil
}

func (d *Driver) mismatch(op string, stored int) error {
	return d.countStore().Mismatch(op, d.cfg.Partitions, stored)
}

// countStore names the database file in partition-count errors.
func (d *Driver) countStore() driverkit.CountStore {
	return driverkit.CountStore{Driver: "ferrysqlite", Kind: "database", Name: d.path}
}

// checkFeed refuses a feed of a driver configured with another count than
// the stored one, or of a partition outside the stored range.
func (d *Driver) checkFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) error {
	stored, err := d.StoredPartitions(ctx)
	if err != nil {
		return err
	}
	return d.countStore().CheckFeed("open feed "+p.Feed, d.cfg.Partitions, stored, p.Partition)
}

// SetPartitions implements ferrydriver.Store. It runs in one
// write transaction, so no producer writes while it checks and changes the
// count, and every later append reads the new count. Unless p.Force, it
// refuses with ferrydriver.ErrPartitionChangeUnsafe while a relay holds a
// lease on a feed ("<feed>/<partition>"), while a feed's checkpoint has not
// passed every event of its partition or the feed has parked events, or
// while a partition has events and no feed has a checkpoint for it: a key whose partition changes must have
// nothing left undelivered in the old one.
func (d *Driver) SetPartitions(ctx context.Context, p *ferrydriver.SetPartitionsParams) (int, error) {
	if p.Partitions < 1 || p.Partitions > ferrydriver.MaxPartitions {
		return 0, fmt.Errorf("ferrysqlite: set the partition count to %d: out of range: use 1 to %d", p.Partitions, ferrydriver.MaxPartitions)
	}
	op := fmt.Sprintf("set the partition count of %s to %d", d.path, p.Partitions)
	var res int
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		prev, err := d.storedPartitions(ctx, tx)
		if err != nil && !(p.Force && errors.Is(err, ferrydriver.ErrMisconfigured)) {
			return err
		}
		res = prev
		if !p.Force {
			problems, err := changeProblems(ctx, tx, prev)
			if err != nil {
				return d.wrapErr(op, err)
			}
			if len(problems) > 0 {
				return driverkit.PartitionChangeRefused("ferrysqlite", op, problems)
			}
		}
		if prev == p.Partitions {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM ferry_settings`); err != nil {
			return d.wrapErr(op, err)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO ferry_settings (partitions) VALUES (?)`, p.Partitions)
		return d.wrapErr(op, err)
	})
	if err != nil {
		return 0, err
	}
	d.stored.Store(int64(p.Partitions))
	return res, nil
}

// changeProblems says why changing the count now is unsafe, if it is. Ids
// are drawn in commit order, so a feed has delivered every event of its
// partition at or below its cursor.
func changeProblems(ctx context.Context, tx *sql.Tx, stored int) ([]string, error) {
	var problems []string
	t := now()
	rows, err := tx.QueryContext(ctx, `SELECT name, holder, expires_at FROM ferry_leases WHERE expires_at > ? ORDER BY name`, micros(t))
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name, holder string
		var expires int64
		if err := rows.Scan(&name, &holder, &expires); err != nil {
			rows.Close()
			return nil, err
		}
		if driverkit.IsRelayLease(name) {
			problems = append(problems, driverkit.LeaseHeldProblem(holder, name,
				"its lease expires in "+fromMicros(expires).Sub(t).Round(time.Second).String()))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	type checkpoint struct {
		feed      string
		partition int
		cursor    []byte
	}
	var cps []checkpoint
	rows, err = tx.QueryContext(ctx, `SELECT feed, partition, cursor FROM ferry_checkpoints ORDER BY feed`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var c checkpoint
		if err := rows.Scan(&c.feed, &c.partition, &c.cursor); err != nil {
			rows.Close()
			return nil, err
		}
		if n, ok := driverkit.FeedPartition(c.feed); ok && n == c.partition {
			cps = append(cps, c)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	var highest int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(max(partition), -1) FROM ferry_outbox`).Scan(&highest); err != nil {
		return nil, err
	}
	read := map[int]bool{}
	for _, c := range cps {
		read[c.partition] = true
		pos, err := decodeCursor(c.cursor)
		if err != nil {
			return nil, err
		}
		var n int64
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM ferry_outbox WHERE partition = ? AND id > ?`, c.partition, pos.After).Scan(&n); err != nil {
			return nil, err
		}
		if n > 0 {
			problems = append(problems, fmt.Sprintf("feed %s has not delivered %s event(s) of partition %d", c.feed, strconv.FormatInt(n, 10), c.partition))
		}
	}
	// A stuck key's parked events (migration 006) are not delivered,
	// though the feed's checkpoint passed them.
	rows, err = tx.QueryContext(ctx, `SELECT feed, count(*) FROM ferry_parked GROUP BY feed ORDER BY feed`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var feed string
		var n int64
		if err := rows.Scan(&feed, &n); err != nil {
			rows.Close()
			return nil, err
		}
		problems = append(problems, driverkit.ParkedProblem(feed, n))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for part := range max(stored, highest+1) {
		if read[part] {
			continue
		}
		var has bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ferry_outbox WHERE partition = ?)`, part).Scan(&has); err != nil {
			return nil, err
		}
		if has {
			problems = append(problems, driverkit.UnreadPartitionProblem(part))
		}
	}
	return problems, nil
}
