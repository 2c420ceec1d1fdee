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

// LoadCheckpoint implements ferrydriver.Store.
func (d *Driver) LoadCheckpoint(ctx context.Context, feed string) (*ferrydriver.Checkpoint, error) {
	cp := &ferrydriver.Checkpoint{Feed: feed}
	var updated int64
	err := d.r.QueryRowContext(ctx, `SELECT cursor, term, updated_at FROM ferry_checkpoints WHERE feed = ?`, feed).
		Scan(&cp.Cursor, &cp.Term, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return cp, nil
	}
	if err != nil {
		return nil, d.wrapErr("load checkpoint of "+feed, err)
	}
	cp.UpdatedAt = fromMicros(updated)
	return cp, nil
}

// holds reports whether holder holds the lease name at term, in tx.
func holds(ctx context.Context, tx *sql.Tx, name, holder string, term int64, at time.Time) (bool, error) {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM ferry_leases WHERE name = ? AND holder = ? AND term = ? AND expires_at > ?`,
		name, holder, term, micros(at)).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// SaveCheckpoint implements ferrydriver.Store.
func (d *Driver) SaveCheckpoint(ctx context.Context, p *ferrydriver.SaveCheckpointParams) error {
	return d.write(ctx, "save checkpoint of "+p.Feed, func(tx *sql.Tx) error {
		t := now()
		ok, err := holds(ctx, tx, p.Feed, p.Holder, p.Term, t)
		if err != nil {
			return d.wrapErr("save checkpoint of "+p.Feed, err)
		}
		if !ok {
			return fmt.Errorf("ferrysqlite: save checkpoint of %s at term %d: %w", p.Feed, p.Term, ferrydriver.ErrLeaseLost)
		}
		_, err = tx.ExecContext(ctx, `
INSERT INTO ferry_checkpoints (feed, partition, cursor, term, updated_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (feed) DO UPDATE SET cursor = excluded.cursor, term = excluded.term, updated_at = excluded.updated_at`,
			p.Feed, p.Partition, p.Cursor, p.Term, micros(t))
		return d.wrapErr("save checkpoint of "+p.Feed, err)
	})
}

func (d *Driver) readLease(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, name string, at time.Time) (*ferrydriver.Lease, error) {
	l := &ferrydriver.Lease{Name: name, Now: at}
	var expires int64
	err := q.QueryRowContext(ctx, `SELECT holder, term, expires_at FROM ferry_leases WHERE name = ?`, name).Scan(&l.Holder, &l.Term, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("ferrysqlite: lease %s: %w", name, ferrydriver.ErrNotFound)
	}
	if err != nil {
		return nil, d.wrapErr("read lease "+name, err)
	}
	l.ExpiresAt = fromMicros(expires)
	return l, nil
}

// AcquireLease implements ferrydriver.Store.
func (d *Driver) AcquireLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error) {
	var out *ferrydriver.Lease
	err := d.write(ctx, "acquire lease "+p.Name, func(tx *sql.Tx) error {
		t := now()
		_, err := tx.ExecContext(ctx, `
INSERT INTO ferry_leases (name, holder, term, expires_at) VALUES (?1, ?2, 1, ?3 + ?4)
ON CONFLICT (name) DO UPDATE SET
    term = CASE WHEN holder = excluded.holder AND expires_at > ?3 THEN term ELSE term + 1 END,
    holder = excluded.holder,
    expires_at = excluded.expires_at
 WHERE holder = excluded.holder OR expires_at <= ?3`, p.Name, p.Holder, micros(t), p.TTL.Microseconds())
		if err != nil {
			return d.wrapErr("acquire lease "+p.Name, err)
		}
		out, err = d.readLease(ctx, tx, p.Name, t)
		return err
	})
	return out, err
}

// RenewLease implements ferrydriver.Store.
func (d *Driver) RenewLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error) {
	var out *ferrydriver.Lease
	err := d.write(ctx, "renew lease "+p.Name, func(tx *sql.Tx) error {
		t := now()
		res, err := tx.ExecContext(ctx, `UPDATE ferry_leases SET expires_at = ? WHERE name = ? AND holder = ? AND term = ? AND expires_at > ?`,
			micros(t)+p.TTL.Microseconds(), p.Name, p.Holder, p.Term, micros(t))
		if err != nil {
			return d.wrapErr("renew lease "+p.Name, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("ferrysqlite: renew lease %s at term %d: %w", p.Name, p.Term, ferrydriver.ErrLeaseLost)
		}
		out, err = d.readLease(ctx, tx, p.Name, t)
		return err
	})
	return out, err
}

// ReleaseLease implements ferrydriver.Store.
func (d *Driver) ReleaseLease(ctx context.Context, p *ferrydriver.LeaseParams) error {
	return d.write(ctx, "release lease "+p.Name, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE ferry_leases SET expires_at = ? WHERE name = ? AND holder = ? AND term = ?`,
			micros(now())-1, p.Name, p.Holder, p.Term)
		return d.wrapErr("release lease "+p.Name, err)
	})
}

// GetLease implements ferrydriver.Store.
func (d *Driver) GetLease(ctx context.Context, name string) (*ferrydriver.Lease, error) {
	return d.readLease(ctx, d.r, name, now())
}

const deadLetterColumns = `feed, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at, reason, failed_at`

// familyTerm matches the partitions of a feed: its name ?9 ("hooks/")
// then a partition number.
const familyTerm = `(substr(feed, 1, length(?9)) = ?9 AND length(feed) > length(?9) AND substr(feed, length(?9) + 1) NOT GLOB '*[^0-9]*')`

// partitionLow is the id every feed of partition has passed: the lowest
// position among the saved checkpoints and cursor (0: nothing yet).
func (d *Driver) partitionLow(ctx context.Context, tx *sql.Tx, partition int, cursor []byte) (int64, error) {
	low, err := decodeCursor(cursor)
	if err != nil {
		return 0, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT cursor FROM ferry_checkpoints WHERE partition = ? AND cursor IS NOT NULL`, partition)
	if err != nil {
		return 0, d.wrapErr("read the checkpoints of partition "+strconv.Itoa(partition), err)
	}
	defer rows.Close()
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return 0, d.wrapErr("read checkpoints", err)
		}
		c, err := decodeCursor(b)
		if err != nil {
			return 0, err
		}
		low.After = min(low.After, c.After)
	}
	if err := rows.Err(); err != nil {
		return 0, d.wrapErr("read checkpoints", err)
	}
	return max(low.After, 0), nil
}

// DeleteDelivered implements ferrydriver.Store: it removes events at or
// below every feed's position (the saved checkpoints of the partition and
// p.Cursor), older than p.OlderThan, oldest first.
func (d *Driver) DeleteDelivered(ctx context.Context, p *ferrydriver.DeleteDeliveredParams) (int64, error) {
	var n int64
	err := d.write(ctx, "delete delivered events", func(tx *sql.Tx) error {
		low, err := d.partitionLow(ctx, tx, p.Partition, p.Cursor)
		if err != nil || low == 0 {
			return err
		}
		limit := p.Limit
		if limit <= 0 {
			limit = 10000
		}
		res, err := tx.ExecContext(ctx, `
DELETE FROM ferry_outbox WHERE id IN (
    SELECT id FROM ferry_outbox WHERE partition = ? AND id <= ? ORDER BY id LIMIT ?)
  AND created_at < ?`, p.Partition, low, limit, micros(now())-p.OlderThan.Microseconds())
		if err != nil {
			return d.wrapErr("delete delivered events", err)
		}
		n, _ = res.RowsAffected()
		return nil
	})
	return n, err
}

// PruneKeys implements ferrydriver.Store: a chunk of ferry_keys in key
// order; a key of the partition goes when its newest event is at or below
// every feed's position and it was appended more than p.IdleFor ago. The
// single writer keeps appends out while the chunk is pruned.
func (d *Driver) PruneKeys(ctx context.Context, p *ferrydriver.PruneKeysParams) (*ferrydriver.PruneKeysResult, error) {
	res := &ferrydriver.PruneKeysResult{Next: p.After}
	limit := p.Limit
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	err := d.write(ctx, "prune idle keys", func(tx *sql.Tx) error {
		low, err := d.partitionLow(ctx, tx, p.Partition, p.Cursor)
		if err != nil || low == 0 {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT key, last_id, touched_at FROM ferry_keys WHERE key > ? ORDER BY key LIMIT ?`, p.After, limit)
		if err != nil {
			return d.wrapErr("prune idle keys", err)
		}
		defer rows.Close()
		cut := micros(now()) - p.IdleFor.Microseconds()
		var keys []string
		read := 0
		res.Next = ""
		for rows.Next() {
			var key string
			var lastID, touched int64
			if err := rows.Scan(&key, &lastID, &touched); err != nil {
				return d.wrapErr("prune idle keys", err)
			}
			read++
			res.Next = key
			if lastID <= low && touched < cut && d.PartitionOf(key) == p.Partition {
				keys = append(keys, key)
			}
		}
		if err := rows.Err(); err != nil {
			return d.wrapErr("prune idle keys", err)
		}
		rows.Close()
		if read < limit {
			res.Next = ""
		}
		for _, k := range keys {
			r, err := tx.ExecContext(ctx, `DELETE FROM ferry_keys WHERE key = ?`, k)
			if err != nil {
				return d.wrapErr("prune idle keys", err)
			}
			n, _ := r.RowsAffected()
			res.Pruned += n
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// FeedLag implements ferrydriver.Store: the first
// ferrydriver.ExactCountLimit events after the checkpoint and the
// partition's highest id, both ranges of ferry_outbox_partition_idx.
func (d *Driver) FeedLag(ctx context.Context, p *ferrydriver.FeedLagParams) (*ferrydriver.FeedLag, error) {
	cp, err := d.LoadCheckpoint(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	pos, err := decodeCursor(cp.Cursor)
	if err != nil {
		return nil, err
	}
	return d.feedLag(ctx, p.Feed, p.Partition, pos.After)
}

func (d *Driver) feedLag(ctx context.Context, feed string, partition int, after int64) (*ferrydriver.FeedLag, error) {
	lag := &ferrydriver.FeedLag{Now: now()}
	var n, last, high int64
	var oldest sql.NullInt64
	err := d.r.QueryRowContext(ctx, `
SELECT count(*), COALESCE(max(id), 0), min(created_at),
       COALESCE((SELECT id FROM ferry_outbox WHERE partition = ?1 ORDER BY id DESC LIMIT 1), 0)
  FROM (SELECT id, created_at FROM ferry_outbox WHERE partition = ?1 AND id > ?2 ORDER BY id LIMIT ?3)`,
		partition, after, ferrydriver.ExactCountLimit).Scan(&n, &last, &oldest, &high)
	if err != nil {
		return nil, d.wrapErr("measure lag of "+feed, err)
	}
	lag.Events, lag.Estimated = driverkit.ExtrapolateLag(n, float64(after), float64(last), float64(high))
	if oldest.Valid {
		lag.OldestPending = fromMicros(oldest.Int64)
	}
	return lag, nil
}

// ListFeeds implements ferrydriver.Store: the checkpoints and leases (a
// row per feed partition, relay member and chain source), then the
// distinct feeds of the dead letters and the parked events, each by a skip
// along an index that leads with the feed (one probe per feed).
func (d *Driver) ListFeeds(ctx context.Context) ([]string, error) {
	rows, err := d.r.QueryContext(ctx, `
WITH RECURSIVE dl(feed) AS (
    SELECT min(feed) FROM ferry_dead_letters
    UNION ALL
    SELECT (SELECT min(feed) FROM ferry_dead_letters WHERE feed > dl.feed) FROM dl WHERE dl.feed IS NOT NULL
), pk(feed) AS (
    SELECT min(feed) FROM ferry_parked
    UNION ALL
    SELECT (SELECT min(feed) FROM ferry_parked WHERE feed > pk.feed) FROM pk WHERE pk.feed IS NOT NULL
)
SELECT feed FROM ferry_checkpoints
 UNION SELECT name FROM ferry_leases
 UNION SELECT feed FROM dl WHERE feed IS NOT NULL
 UNION SELECT feed FROM pk WHERE feed IS NOT NULL
 ORDER BY 1`)
	if err != nil {
		return nil, d.wrapErr("list feeds", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, d.wrapErr("list feeds", err)
		}
		out = append(out, n)
	}
	return out, d.wrapErr("list feeds", rows.Err())
}

// FeedStatus implements ferrydriver.Store.
func (d *Driver) FeedStatus(ctx context.Context, p *ferrydriver.FeedStatusParams) (*ferrydriver.FeedStatus, error) {
	st := &ferrydriver.FeedStatus{Feed: p.Feed, Now: now()}
	cp, err := d.LoadCheckpoint(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	st.Checkpoint = cp
	if l, err := d.GetLease(ctx, p.Feed); err == nil {
		st.Lease = l
	} else if !errors.Is(err, ferrydriver.ErrNotFound) {
		return nil, err
	}
	pos, err := decodeCursor(cp.Cursor)
	if err != nil {
		return nil, err
	}
	if !p.Exact {
		lag, err := d.feedLag(ctx, p.Feed, p.Partition, pos.After)
		if err != nil {
			return nil, err
		}
		st.LagEvents, st.LagEstimated, st.OldestPending = lag.Events, lag.Estimated, lag.OldestPending
		if err := d.r.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT 1 FROM ferry_dead_letters WHERE feed = ? LIMIT ?)`,
			p.Feed, ferrydriver.ExactCountLimit+1).Scan(&st.DeadLetters); err != nil {
			return nil, d.wrapErr("count dead letters of "+p.Feed, err)
		}
		if st.DeadLetters > ferrydriver.ExactCountLimit {
			st.DeadLetters, st.DeadLettersMore = ferrydriver.ExactCountLimit, true
		}
		return st, nil
	}
	var oldest sql.NullInt64
	if err := d.r.QueryRowContext(ctx, `SELECT count(*), min(created_at) FROM ferry_outbox WHERE partition = ? AND id > ?`,
		p.Partition, pos.After).Scan(&st.LagEvents, &oldest); err != nil {
		return nil, d.wrapErr("measure lag of "+p.Feed, err)
	}
	if oldest.Valid {
		st.OldestPending = fromMicros(oldest.Int64)
	}
	if err := d.r.QueryRowContext(ctx, `SELECT count(*) FROM ferry_dead_letters WHERE feed = ?`, p.Feed).Scan(&st.DeadLetters); err != nil {
		return nil, d.wrapErr("count dead letters of "+p.Feed, err)
	}
	return st, nil
}
