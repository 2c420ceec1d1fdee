package ferrymysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// AppendTx implements ferrydriver.Driver: the events are written in tx (a
// transaction of the database that holds Ferry's tables) and share its
// fate.
func (d *Driver) AppendTx(ctx context.Context, tx *sql.Tx, events []*ferryevent.Event) error {
	return d.append(ctx, tx, events)
}

// Append implements ferrydriver.Store.
func (d *Driver) Append(ctx context.Context, events []*ferryevent.Event) error {
	return d.write(ctx, "append", func(tx *sql.Tx) error { return d.append(ctx, tx, events) })
}

// A key's sequence numbers are taken under its row's lock, held until the
// transaction ends: the key's next writer waits, so the one that commits
// first holds the lower numbers, and its rows come first in the binlog.
//
// The row is locked by an UPDATE of the existing row only: a unique match
// locks that record and no gap. INSERT ... ON DUPLICATE KEY UPDATE locks
// the gap before the record too (REPEATABLE READ), and writers creating
// new keys in that gap deadlocked with it (error 1213, ConcurrentProducers);
// so did an UPDATE that matched nothing, and writers that created one new
// key at once (each INSERT that found the other's row kept a shared lock
// on it, and each UPDATE then waited for the other's). So a key that the
// transaction cannot see (a consistent read: no lock) is created first,
// with Seq 0, by a statement of its own outside the transaction, which
// waits at most a second for a lock: a rolled-back append leaves the row
// at 0, so its key's next event still gets Seq 1.
const (
	sqlTakeSeqs = `UPDATE ferry_keys SET seq = LAST_INSERT_ID(seq + ?), touched_at = ` + sqlNow + ` WHERE k = ?`
	sqlNewKey   = `INSERT INTO ferry_keys (k, seq, touched_at) VALUES (?, ?, ` + sqlNow + `)`
	sqlMakeKeys = `SET STATEMENT innodb_lock_wait_timeout = 1 FOR INSERT IGNORE INTO ferry_keys (k, seq, touched_at) VALUES `
)

// takeSeqs takes count sequence numbers of each key, in key order, and
// returns each key's first.
func (d *Driver) takeSeqs(ctx context.Context, tx *sql.Tx, keys []string, count map[string]int64) (map[string]int64, error) {
	var unknown []any
	for _, k := range keys {
		if !d.knownKeys.has(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		exists := map[string]bool{}
		rows, err := tx.QueryContext(ctx, `SELECT k FROM ferry_keys FORCE INDEX (PRIMARY) WHERE k IN (?`+strings.Repeat(", ?", len(unknown)-1)+`)`, unknown...)
		if err != nil {
			return nil, d.wrapErr("append: read the keys' sequences", err)
		}
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return nil, d.wrapErr("append: read the keys' sequences", err)
			}
			exists[k] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, d.wrapErr("append: read the keys' sequences", err)
		}
		var missing []any
		for _, k := range unknown {
			if !exists[k.(string)] {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			// Outside the transaction; if it cannot (a lock it waited
			// for too long), the UPDATE below finds no row and the key is
			// inserted in the transaction.
			_, err := d.db.ExecContext(ctx, sqlMakeKeys+`(?, 0, `+sqlNow+`)`+strings.Repeat(`, (?, 0, `+sqlNow+`)`, len(missing)-1), missing...)
			if err != nil && ctx.Err() != nil {
				return nil, d.wrapErr("append: create the keys' sequences", err)
			}
		}
	}
	if len(keys) > 1 {
		return d.takeSeqsOfKeys(ctx, tx, keys, count)
	}
	first := make(map[string]int64, len(keys))
	for _, k := range keys {
		n := count[k]
		res, err := tx.ExecContext(ctx, sqlTakeSeqs, n, k)
		if err != nil {
			return nil, d.wrapErr("append: sequence of key "+k, err)
		}
		if affected, _ := res.RowsAffected(); affected == 0 {
			// Not there (PruneKeys removed it, or it could not be made
			// above): created in the transaction.
			if _, err := tx.ExecContext(ctx, sqlNewKey, k, n); err != nil {
				return nil, d.wrapErr("append: sequence of key "+k, err)
			}
			first[k] = 1
			continue
		}
		last, err := res.LastInsertId()
		if err != nil {
			return nil, d.wrapErr("append: sequence of key "+k, err)
		}
		first[k] = last - n + 1
		d.knownKeys.add(k)
	}
	return first, nil
}

// takeSeqsOfKeys is takeSeqs for several keys: one UPDATE of them all (it
// locks their rows in key order, as one key's UPDATE after another would),
// and one read of their new numbers (the transaction sees its own
// writes), whatever their number.
func (d *Driver) takeSeqsOfKeys(ctx context.Context, tx *sql.Tx, keys []string, count map[string]int64) (map[string]int64, error) {
	var q strings.Builder
	args := make([]any, 0, 3*len(keys))
	// FORCE INDEX: on a small table the optimizer scans the whole index for
	// the IN list, which locks every key row and waits for any producer
	// holding one (OpenProducerHoldsOnlyItsKeys); looked up by the primary
	// key, each key locks its own row only.
	q.WriteString(`UPDATE ferry_keys FORCE INDEX (PRIMARY) SET touched_at = ` + sqlNow + `, seq = seq + CASE k`)
	for _, k := range keys {
		q.WriteString(` WHEN ? THEN ?`)
		args = append(args, k, count[k])
	}
	q.WriteString(` END WHERE k IN (?` + strings.Repeat(`, ?`, len(keys)-1) + `)`)
	in := make([]any, len(keys))
	for i, k := range keys {
		in[i] = k
	}
	res, err := tx.ExecContext(ctx, q.String(), append(args, in...)...)
	if err != nil {
		return nil, d.wrapErr("append: the keys' sequences", err)
	}
	first := make(map[string]int64, len(keys))
	if n, _ := res.RowsAffected(); int(n) < len(keys) {
		// Some are not there (PruneKeys removed them, or they could not be
		// made): created in the transaction, after the others.
		rows, err := tx.QueryContext(ctx, `SELECT k FROM ferry_keys FORCE INDEX (PRIMARY) WHERE k IN (?`+strings.Repeat(`, ?`, len(keys)-1)+`)`, in...)
		if err != nil {
			return nil, d.wrapErr("append: the keys' sequences", err)
		}
		have := map[string]bool{}
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return nil, d.wrapErr("append: the keys' sequences", err)
			}
			have[k] = true
		}
		rows.Close()
		for _, k := range keys {
			if !have[k] {
				if _, err := tx.ExecContext(ctx, sqlNewKey, k, count[k]); err != nil {
					return nil, d.wrapErr("append: sequence of key "+k, err)
				}
				first[k] = 1
			}
		}
	}
	rows, err := tx.QueryContext(ctx, `SELECT k, seq FROM ferry_keys FORCE INDEX (PRIMARY) WHERE k IN (?`+strings.Repeat(`, ?`, len(keys)-1)+`)`, in...)
	if err != nil {
		return nil, d.wrapErr("append: the keys' sequences", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var seq int64
		if err := rows.Scan(&k, &seq); err != nil {
			return nil, d.wrapErr("append: the keys' sequences", err)
		}
		if _, created := first[k]; !created {
			first[k] = seq - count[k] + 1
			d.knownKeys.add(k)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("append: the keys' sequences", err)
	}
	for _, k := range keys {
		if _, ok := first[k]; !ok {
			return nil, fmt.Errorf("ferrymysql: append: the sequence of key %q was not found after its update", k)
		}
	}
	return first, nil
}

// appendChunkBytes bounds one INSERT of outbox rows, well below the
// servers' default max_allowed_packet (16 MiB on MariaDB 10.11, 64 MiB on
// MySQL 8).
const appendChunkBytes = 4 << 20

func (d *Driver) append(ctx context.Context, tx *sql.Tx, events []*ferryevent.Event) error {
	if len(events) == 0 {
		return nil
	}
	partitions, err := d.writeCount(ctx, tx, "append")
	if err != nil {
		return err
	}
	// Each key's numbers, its keys taken in byte order: two transactions
	// appending the same keys lock them in one order and do not deadlock.
	count := map[string]int64{}
	var keys []string
	for _, ev := range events {
		if count[ev.Key] == 0 {
			keys = append(keys, ev.Key)
		}
		count[ev.Key]++
	}
	slices.Sort(keys)
	next, err := d.takeSeqs(ctx, tx, keys, count)
	if err != nil {
		return err
	}
	var (
		sqlb  strings.Builder
		args  []any
		size  int
		flush = func() error {
			if len(args) == 0 {
				return nil
			}
			_, err := tx.ExecContext(ctx, sqlb.String(), args...)
			sqlb.Reset()
			args, size = args[:0], 0
			return d.wrapErr("append", err)
		}
	)
	for _, ev := range events {
		c, err := encodeEvent(ev)
		if err != nil {
			return err
		}
		if size > 0 && size+len(c.payload) > appendChunkBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		if len(args) == 0 {
			sqlb.WriteString(`INSERT INTO ferry_outbox (p, event_id, topic, k, seq, type, source, content_type, headers, payload, created_at, appended_at) VALUES `)
		} else {
			sqlb.WriteString(", ")
		}
		sqlb.WriteString(`(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ` + sqlNow + `)`)
		ev.Seq = next[ev.Key]
		next[ev.Key]++
		args = append(args, ferrydriver.PartitionOf(ev.Key, partitions), c.id, ev.Topic, ev.Key, ev.Seq, ev.Type, ev.Source, ev.ContentType,
			c.headers, c.payload, micros(ev.CreatedAt))
		size += len(c.payload) + 512
	}
	return flush()
}

// partitionLow is the oldest append time any feed of the partition may
// still need for a recovery scan (cursor.scanFrom): the earliest of the
// saved checkpoints' and cur's. 0: keep everything (a feed has delivered
// nothing yet, or is scanning the outbox).
func (d *Driver) partitionLow(ctx context.Context, partition int, cur []byte) (int64, error) {
	c, err := decodeCursor(cur)
	if err != nil {
		return 0, err
	}
	low := c.scanFrom(d.cfg.RecoveryMargin)
	if len(cur) > 0 && (low == 0 || c.Scan != nil) {
		return 0, nil
	}
	rows, err := d.db.QueryContext(ctx, `SELECT pos FROM ferry_checkpoints WHERE p = ?`, partition)
	if err != nil {
		return 0, d.wrapErr(fmt.Sprintf("read the checkpoints of partition %d", partition), err)
	}
	defer rows.Close()
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return 0, err
		}
		other, err := decodeCursor(b)
		if err != nil {
			return 0, err
		}
		from := other.scanFrom(d.cfg.RecoveryMargin)
		if other.Scan != nil || from == 0 {
			return 0, nil
		}
		if low == 0 || from < low {
			low = from
		}
	}
	return low, rows.Err()
}

// DeleteDelivered implements ferrydriver.Store: it removes events older
// than p.OlderThan and than what any feed of the partition may still need
// for a recovery scan, oldest first, at most p.Limit. The feeds read the
// binlog, which keeps the rows' images: a row removed here is still
// delivered.
func (d *Driver) DeleteDelivered(ctx context.Context, p *ferrydriver.DeleteDeliveredParams) (int64, error) {
	low, err := d.partitionLow(ctx, p.Partition, p.Cursor)
	if err != nil || low == 0 {
		return 0, err
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 10000
	}
	res, err := d.db.ExecContext(ctx, `DELETE FROM ferry_outbox WHERE p = ? AND appended_at < LEAST(?, `+sqlNow+` - ?) ORDER BY appended_at LIMIT ?`,
		p.Partition, low, p.OlderThan.Microseconds(), limit)
	if err != nil {
		return 0, d.wrapErr("delete delivered events", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// PruneKeys implements ferrydriver.Store: a chunk of ferry_keys in key
// order; a key of the partition goes when it was last appended to more
// than p.IdleFor ago and none of its events is left in the outbox (they
// were delivered and removed by retention: a recovery scan reads a key's
// events in Seq order, so a restarted key must not meet its old events
// there). Each key is deleted only if its sequence is still the one read:
// a writer holding the key's row makes the delete wait for it and then
// match nothing.
func (d *Driver) PruneKeys(ctx context.Context, p *ferrydriver.PruneKeysParams) (*ferrydriver.PruneKeysResult, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	rows, err := d.db.QueryContext(ctx, `SELECT k, seq, touched_at < `+sqlNow+` - ? FROM ferry_keys WHERE k > ? ORDER BY k LIMIT ?`,
		p.IdleFor.Microseconds(), p.After, limit)
	if err != nil {
		return nil, d.wrapErr("prune idle keys", err)
	}
	type key struct {
		k   string
		seq int64
	}
	var idle []key
	read := 0
	res := &ferrydriver.PruneKeysResult{}
	for rows.Next() {
		var k key
		var old bool
		if err := rows.Scan(&k.k, &k.seq, &old); err != nil {
			rows.Close()
			return nil, d.wrapErr("prune idle keys", err)
		}
		read++
		res.Next = k.k
		if old && d.PartitionOf(k.k) == p.Partition {
			idle = append(idle, k)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("prune idle keys", err)
	}
	if read < limit {
		res.Next = ""
	}
	for _, k := range idle {
		// A plain read (no lock): a locking subquery of the DELETE would
		// hold gap locks of the outbox against the producers.
		var live bool
		if err := d.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ferry_outbox WHERE p = ? AND k = ?)`, p.Partition, k.k).Scan(&live); err != nil {
			return nil, d.wrapErr("prune idle keys", err)
		}
		if live {
			continue
		}
		r, err := d.db.ExecContext(ctx, `DELETE FROM ferry_keys WHERE k = ? AND seq = ?`, k.k, k.seq)
		if err != nil {
			return nil, d.wrapErr("prune idle keys", err)
		}
		n, _ := r.RowsAffected()
		res.Pruned += n
		d.knownKeys.forget(k.k)
	}
	return res, nil
}

// FeedLag implements ferrydriver.Store. Positions are append times (the
// server's clock): the first ferrydriver.ExactCountLimit events appended
// after the last acknowledged one are counted, and their density in time
// is extrapolated up to the partition's newest append, both ranges of
// ferry_outbox_appended_idx. Approximate even when exact: an event
// appended before the last acknowledged one by a transaction that
// committed after it is not counted.
func (d *Driver) FeedLag(ctx context.Context, p *ferrydriver.FeedLagParams) (*ferrydriver.FeedLag, error) {
	cp, err := d.LoadCheckpoint(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	c, err := decodeCursor(cp.Cursor)
	if err != nil {
		return nil, err
	}
	return d.feedLag(ctx, p.Feed, p.Partition, c.At)
}

func (d *Driver) feedLag(ctx context.Context, feed string, partition int, at int64) (*ferrydriver.FeedLag, error) {
	var n, now int64
	var first, last, oldest, newest sql.NullInt64
	err := d.db.QueryRowContext(ctx, `
SELECT COUNT(*), MIN(appended_at), MAX(appended_at), MIN(created_at), `+sqlNow+`,
       (SELECT MAX(appended_at) FROM ferry_outbox WHERE p = ?)
  FROM (SELECT appended_at, created_at FROM ferry_outbox WHERE p = ? AND appended_at > ? ORDER BY appended_at LIMIT ?) s`,
		partition, partition, at, ferrydriver.ExactCountLimit).Scan(&n, &first, &last, &oldest, &now, &newest)
	if err != nil {
		return nil, d.wrapErr("measure lag of "+feed, err)
	}
	lag := &ferrydriver.FeedLag{Now: fromMicros(now), Events: n}
	if oldest.Valid {
		lag.OldestPending = fromMicros(oldest.Int64)
	}
	if n >= ferrydriver.ExactCountLimit && newest.Valid {
		lag.Events, lag.Estimated = driverkit.ExtrapolateLag(n, float64(first.Int64-1), float64(last.Int64), float64(newest.Int64))
	}
	return lag, nil
}

// ListFeeds implements ferrydriver.Store: the checkpoints and leases (a
// row per feed partition, relay member and chain source), then the
// distinct feeds of the dead letters and the parked events, read by a
// loose scan of an index that leads with the feed (one probe per feed).
func (d *Driver) ListFeeds(ctx context.Context) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT feed FROM ferry_checkpoints
 UNION SELECT name FROM ferry_leases
 UNION SELECT DISTINCT feed FROM ferry_dead_letters
 UNION SELECT DISTINCT feed FROM ferry_parked
 ORDER BY 1`)
	if err != nil {
		return nil, d.wrapErr("list feeds", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n []byte
		if err := rows.Scan(&n); err != nil {
			return nil, d.wrapErr("list feeds", err)
		}
		out = append(out, string(n))
	}
	return out, d.wrapErr("list feeds", rows.Err())
}

// FeedStatus implements ferrydriver.Store; its lag is FeedLag's (exact:
// counted in full).
func (d *Driver) FeedStatus(ctx context.Context, p *ferrydriver.FeedStatusParams) (*ferrydriver.FeedStatus, error) {
	cp, err := d.LoadCheckpoint(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	st := &ferrydriver.FeedStatus{Feed: p.Feed, Checkpoint: cp}
	if l, err := d.GetLease(ctx, p.Feed); err == nil {
		st.Lease = l
	} else if !errors.Is(err, ferrydriver.ErrNotFound) {
		return nil, err
	}
	c, err := decodeCursor(cp.Cursor)
	if err != nil {
		return nil, err
	}
	if !p.Exact {
		lag, err := d.feedLag(ctx, p.Feed, p.Partition, c.At)
		if err != nil {
			return nil, err
		}
		st.Now, st.LagEvents, st.LagEstimated, st.OldestPending = lag.Now, lag.Events, lag.Estimated, lag.OldestPending
		if err := d.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM ferry_dead_letters WHERE feed = ? LIMIT ?) s`,
			p.Feed, ferrydriver.ExactCountLimit+1).Scan(&st.DeadLetters); err != nil {
			return nil, d.wrapErr("count dead letters of "+p.Feed, err)
		}
		if st.DeadLetters > ferrydriver.ExactCountLimit {
			st.DeadLetters, st.DeadLettersMore = ferrydriver.ExactCountLimit, true
		}
		return st, nil
	}
	var oldest sql.NullInt64
	var now int64
	if err := d.db.QueryRowContext(ctx, `SELECT COUNT(*), MIN(created_at), `+sqlNow+` FROM ferry_outbox WHERE p = ? AND appended_at > ?`,
		p.Partition, c.At).Scan(&st.LagEvents, &oldest, &now); err != nil {
		return nil, d.wrapErr("measure lag of "+p.Feed, err)
	}
	st.Now = fromMicros(now)
	if oldest.Valid {
		st.OldestPending = fromMicros(oldest.Int64)
	}
	if err := d.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM ferry_dead_letters WHERE feed = ?`, p.Feed).Scan(&st.DeadLetters); err != nil {
		return nil, d.wrapErr("count dead letters of "+p.Feed, err)
	}
	return st, nil
}
