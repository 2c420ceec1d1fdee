package ferrymysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// StoredPartitions implements ferrydriver.Store: the partition
// count stored with the schema (ferry_settings).
func (d *Driver) StoredPartitions(ctx context.Context) (int, error) {
	return d.storedPartitions(ctx, d.db, "")
}

func (d *Driver) storedPartitions(ctx context.Context, q queryRower, lock string) (int, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT partitions FROM ferry_settings WHERE id = 1`+lock).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("ferrymysql: read the partition count: %w: ferry_settings in database %s has no row; restore it with `ferry partitions set N --force` (N: the count producers use)",
			ferrydriver.ErrMisconfigured, d.schema)
	}
	if err != nil {
		return 0, d.wrapErr("read the partition count", err)
	}
	d.stored.Store(int64(n))
	return n, nil
}

// writeCount is the partition count an append in tx computes partitions
// with: the stored one, read with a shared lock that SetPartitions waits
// for, which a driver with Config.Partitions set must match.
func (d *Driver) writeCount(ctx context.Context, tx *sql.Tx, op string) (int, error) {
	stored, err := d.storedPartitions(ctx, tx, " LOCK IN SHARE MODE")
	if err != nil {
		return 0, err
	}
	if d.cfg.Partitions > 0 && d.cfg.Partitions != stored {
		return 0, d.countStore().Mismatch(op, d.cfg.Partitions, stored)
	}
	return stored, nil
}

// countStore names the database in partition-count errors.
func (d *Driver) countStore() driverkit.CountStore {
	return driverkit.CountStore{Driver: "ferrymysql", Kind: "database", Name: d.schema}
}

// SetPartitions implements ferrydriver.Store. Its transaction
// locks the stored count's row first: that waits for every producer
// transaction that has appended (they hold it shared), and holds new
// appends back until it ends. Unless p.Force, it refuses with
// ferrydriver.ErrPartitionChangeUnsafe while a relay holds a lease on a
// feed ("<feed>/<partition>"), while a feed has not delivered every event
// of its partition (read from its checkpoint, as its relay would) or has
// parked events, or while a partition has events and no feed has a
// checkpoint for it.
func (d *Driver) SetPartitions(ctx context.Context, p *ferrydriver.SetPartitionsParams) (int, error) {
	if p.Partitions < 1 || p.Partitions > ferrydriver.MaxPartitions {
		return 0, fmt.Errorf("ferrymysql: set the partition count to %d: out of range: use 1 to %d", p.Partitions, ferrydriver.MaxPartitions)
	}
	op := fmt.Sprintf("set the partition count of database %s to %d", d.schema, p.Partitions)
	var res int
	err := d.write(ctx, op, func(tx *sql.Tx) error {
		prev, err := d.storedPartitions(ctx, tx, " FOR UPDATE")
		if err != nil && !(p.Force && errors.Is(err, ferrydriver.ErrMisconfigured)) {
			return err
		}
		res = prev
		if !p.Force {
			problems, err := d.changeProblems(ctx, tx, prev)
			if err != nil {
				return d.wrapErr(op, err)
			}
			if len(problems) > 0 {
				return driverkit.PartitionChangeRefused("ferrymysql", op, problems)
			}
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO ferry_settings (id, partitions) VALUES (1, ?) ON DUPLICATE KEY UPDATE partitions = VALUES(partitions)`, p.Partitions)
		return d.wrapErr(op, err)
	})
	if err != nil {
		return 0, err
	}
	d.stored.Store(int64(p.Partitions))
	return res, nil
}

// changeProblems says why changing the count now is unsafe, if it is.
func (d *Driver) changeProblems(ctx context.Context, tx *sql.Tx, stored int) ([]string, error) {
	var problems []string
	rows, err := tx.QueryContext(ctx, `SELECT name, holder, expires_at - `+sqlNow+` FROM ferry_leases WHERE expires_at > `+sqlNow+` ORDER BY name`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name, holder string
		var left int64
		if err := rows.Scan(&name, &holder, &left); err != nil {
			rows.Close()
			return nil, err
		}
		if driverkit.IsRelayLease(name) {
			problems = append(problems, driverkit.LeaseHeldProblem(holder, name,
				"its lease expires in "+(time.Duration(left)*time.Microsecond).Round(time.Second).String()))
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
	rows, err = tx.QueryContext(ctx, `SELECT feed, p, pos FROM ferry_checkpoints ORDER BY feed`)
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
	read := map[int]bool{}
	for _, c := range cps {
		read[c.partition] = true
		why, err := d.undelivered(ctx, c.feed, c.partition, c.cursor)
		if err != nil {
			return nil, err
		}
		if why != "" {
			problems = append(problems, "feed "+c.feed+" "+why)
		}
	}
	rows, err = tx.QueryContext(ctx, `SELECT feed, COUNT(*) FROM ferry_parked GROUP BY feed ORDER BY feed`)
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
	var highest int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(p), -1) FROM ferry_outbox`).Scan(&highest); err != nil {
		return nil, err
	}
	for part := range max(stored, highest+1) {
		if read[part] {
			continue
		}
		var has bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ferry_outbox WHERE p = ?)`, part).Scan(&has); err != nil {
			return nil, err
		}
		if has {
			problems = append(problems, driverkit.UnreadPartitionProblem(part))
		}
	}
	return problems, nil
}

// undelivered reads a feed from its checkpoint to the binlog's current
// end, as its relay would, and says what is left ("" when nothing is).
func (d *Driver) undelivered(ctx context.Context, name string, partition int, saved []byte) (string, error) {
	pos, err := decodeCursor(saved)
	if err != nil {
		return "", err
	}
	if pos.Scan != nil {
		return "is scanning the outbox (a recovery from a purged binlog)", nil
	}
	if err := d.checkBinlog(ctx); err != nil {
		return "", err
	}
	endFile, endPos, err := masterStatus(ctx, d.db)
	if err != nil {
		return "", d.wrapErr("read the binlog's end", err)
	}
	f := d.newFeed(name, partition, *pos)
	defer f.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !atOrAfter(f.pos.File, f.pos.Pos, endFile, endPos) {
		b, err := f.Read(rctx, &ferrydriver.ReadParams{Max: 1, Wait: 200 * time.Millisecond})
		if err != nil {
			return "", fmt.Errorf("read feed %s after its checkpoint: %w", name, err)
		}
		if len(b.Events)+len(b.Invalid) > 0 || f.pos.Scan != nil {
			return fmt.Sprintf("has not delivered every event of partition %d", partition), nil
		}
	}
	return "", nil
}

// atOrAfter compares binlog positions (file names are numbered with
// zeros in front, so they sort as their numbers).
func atOrAfter(file string, pos uint32, endFile string, endPos uint32) bool {
	if file != endFile {
		return file > endFile
	}
	return pos >= endPos
}
