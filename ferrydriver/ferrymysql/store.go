package ferrymysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// AppendTx implements ferrydriver.Driver: the events are written in tx (a
// transaction of the database that holds Ferry's tables) and share its
// fate.
func (d *Driver) AppendTx(ctx context.Context, tx *sql.Tx, p *ferrydriver.AppendParams) error {
	return d.append(ctx, tx, p.Events)
}

// Append implements ferrydriver.Store.
func (d *Driver) Append(ctx context.Context, p *ferrydriver.AppendParams) error {
	return d.write(ctx, "append", func(tx *sql.Tx) error { return d.append(ctx, tx, p.Events) })
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

// LoadCheckpoint implements ferrydriver.Store.
func (d *Driver) LoadCheckpoint(ctx context.Context, p *ferrydriver.LoadCheckpointParams) (*ferrydriver.Checkpoint, error) {
	cp := &ferrydriver.Checkpoint{Feed: p.Feed}
	var updated int64
	err := d.db.QueryRowContext(ctx, `SELECT pos, term, updated_at FROM ferry_checkpoints WHERE feed = ?`, p.Feed).
		Scan(&cp.Cursor, &cp.Term, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return cp, nil
	}
	if err != nil {
		return nil, d.wrapErr("load checkpoint of "+p.Feed, err)
	}
	cp.UpdatedAt = fromMicros(updated)
	return cp, nil
}

// holds reports whether holder holds lease name at term, and keeps the
// lease's row locked (shared) until tx ends: a takeover waits for the
// fenced write to commit. tx is guarded (see guardedWrite): a holder that
// stops between its statements cannot keep the row locked.
func holds(ctx context.Context, tx *sql.Tx, name, holder string, term int64) (bool, error) {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM ferry_leases WHERE name = ? AND holder = ? AND term = ? AND expires_at > `+sqlNow+` LOCK IN SHARE MODE`,
		name, holder, term).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// fencedWrite runs fn in a transaction if holder holds feed's lease at
// term; ferrydriver.ErrLeaseLost if not.
func (d *Driver) fencedWrite(ctx context.Context, op, feed, holder string, term int64, fn func(tx *sql.Tx) error) error {
	return d.guardedWrite(ctx, op+" of "+feed, func(tx *sql.Tx) error {
		ok, err := holds(ctx, tx, feed, holder, term)
		if err != nil {
			return d.wrapErr(op+" of "+feed, err)
		}
		if !ok {
			return fmt.Errorf("ferrymysql: %s of %s at term %d: %w", op, feed, term, ferrydriver.ErrLeaseLost)
		}
		return fn(tx)
	})
}

// SaveCheckpoint implements ferrydriver.Store.
func (d *Driver) SaveCheckpoint(ctx context.Context, p *ferrydriver.SaveCheckpointParams) error {
	return d.saveCheckpoint(ctx, p, nil)
}

// saveCheckpoint is SaveCheckpoint; fenced, when not nil, runs between the
// fence and the write (a test stops there).
func (d *Driver) saveCheckpoint(ctx context.Context, p *ferrydriver.SaveCheckpointParams, fenced func()) error {
	return d.fencedWrite(ctx, "save checkpoint", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		if fenced != nil {
			fenced()
		}
		_, err := tx.ExecContext(ctx, `
INSERT INTO ferry_checkpoints (feed, p, pos, term, updated_at) VALUES (?, ?, ?, ?, `+sqlNow+`)
ON DUPLICATE KEY UPDATE p = VALUES(p), pos = VALUES(pos), term = VALUES(term), updated_at = VALUES(updated_at)`,
			p.Feed, p.Partition, p.Cursor, p.Term)
		return d.wrapErr("save checkpoint of "+p.Feed, err)
	})
}

func (d *Driver) readLease(ctx context.Context, q queryRower, name string) (*ferrydriver.Lease, error) {
	l := &ferrydriver.Lease{Name: name}
	var expires, now int64
	err := q.QueryRowContext(ctx, `SELECT holder, term, expires_at, `+sqlNow+` FROM ferry_leases WHERE name = ?`, name).
		Scan(&l.Holder, &l.Term, &expires, &now)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && l.Term == 0) {
		return nil, fmt.Errorf("ferrymysql: lease %s: %w", name, ferrydriver.ErrNotFound)
	}
	if err != nil {
		return nil, d.wrapErr("read lease "+name, err)
	}
	l.ExpiresAt, l.Now = fromMicros(expires), fromMicros(now)
	return l, nil
}

// AcquireLease implements ferrydriver.Store: the lease's row is created
// free if it is missing, then locked and decided on: renewed for its
// holder, taken (term + 1) when it expired, left to its holder otherwise.
func (d *Driver) AcquireLease(ctx context.Context, p *ferrydriver.AcquireLeaseParams) (*ferrydriver.Lease, error) {
	var out *ferrydriver.Lease
	op := "acquire lease " + p.Name
	err := d.guardedWrite(ctx, op, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO ferry_leases (name, holder, term, expires_at) VALUES (?, '', 0, 0)
ON DUPLICATE KEY UPDATE name = name`, p.Name); err != nil {
			return d.wrapErr(op, err)
		}
		var holder string
		var term, expires, now int64
		if err := tx.QueryRowContext(ctx, `SELECT holder, term, expires_at, `+sqlNow+` FROM ferry_leases WHERE name = ? FOR UPDATE`, p.Name).
			Scan(&holder, &term, &expires, &now); err != nil {
			return d.wrapErr(op, err)
		}
		switch {
		case holder == p.Holder && expires > now:
			if _, err := tx.ExecContext(ctx, `UPDATE ferry_leases SET expires_at = ? WHERE name = ?`, now+p.TTL.Microseconds(), p.Name); err != nil {
				return d.wrapErr(op, err)
			}
		case expires <= now:
			if _, err := tx.ExecContext(ctx, `UPDATE ferry_leases SET holder = ?, term = term + 1, expires_at = ? WHERE name = ?`,
				p.Holder, now+p.TTL.Microseconds(), p.Name); err != nil {
				return d.wrapErr(op, err)
			}
		}
		var err error
		out, err = d.readLease(ctx, tx, p.Name)
		return err
	})
	return out, err
}

// RenewLease implements ferrydriver.Store.
func (d *Driver) RenewLease(ctx context.Context, p *ferrydriver.RenewLeaseParams) (*ferrydriver.Lease, error) {
	var out *ferrydriver.Lease
	err := d.guardedWrite(ctx, "renew lease "+p.Name, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE ferry_leases SET expires_at = `+sqlNow+` + ? WHERE name = ? AND holder = ? AND term = ? AND expires_at > `+sqlNow,
			p.TTL.Microseconds(), p.Name, p.Holder, p.Term)
		if err != nil {
			return d.wrapErr("renew lease "+p.Name, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("ferrymysql: renew lease %s at term %d: %w", p.Name, p.Term, ferrydriver.ErrLeaseLost)
		}
		out, err = d.readLease(ctx, tx, p.Name)
		return err
	})
	return out, err
}

// ReleaseLease implements ferrydriver.Store.
func (d *Driver) ReleaseLease(ctx context.Context, p *ferrydriver.ReleaseLeaseParams) error {
	_, err := d.db.ExecContext(ctx, `UPDATE ferry_leases SET expires_at = `+sqlNow+` - 1 WHERE name = ? AND holder = ? AND term = ?`,
		p.Name, p.Holder, p.Term)
	return d.wrapErr("release lease "+p.Name, err)
}

// GetLease implements ferrydriver.Store.
func (d *Driver) GetLease(ctx context.Context, name string) (*ferrydriver.Lease, error) {
	return d.readLease(ctx, d.db, name)
}

// InsertDeadLetters implements ferrydriver.Store.
func (d *Driver) InsertDeadLetters(ctx context.Context, p *ferrydriver.InsertDeadLettersParams) error {
	return d.fencedWrite(ctx, "insert dead letters", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		for _, dl := range p.DeadLetters {
			if err := insertDeadLetter(ctx, tx, p.Feed, &dl.Event, dl.Reason); err != nil {
				return d.wrapErr("insert dead letters of "+p.Feed, err)
			}
		}
		return nil
	})
}

func insertDeadLetter(ctx context.Context, tx *sql.Tx, feed string, ev *ferryevent.Event, reason string) error {
	c, err := encodeEvent(ev)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `
INSERT INTO ferry_dead_letters (feed, event_id, topic, k, seq, type, source, content_type, headers, payload, created_at, reason, failed_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, `+sqlNow+`) ON DUPLICATE KEY UPDATE feed = feed`,
		feed, c.id, ev.Topic, ev.Key, ev.Seq, ev.Type, ev.Source, ev.ContentType, c.headers, c.payload, micros(ev.CreatedAt), reason)
	return err
}

const deadLetterColumns = `feed, event_id, topic, k, seq, type, source, content_type, headers, payload, created_at, reason, failed_at`

func scanDeadLetters(rows *sql.Rows) ([]*ferrydriver.DeadLetter, error) {
	defer rows.Close()
	var out []*ferrydriver.DeadLetter
	for rows.Next() {
		dl := &ferrydriver.DeadLetter{}
		ev := &dl.Event
		var id, headers []byte
		var created, failed int64
		if err := rows.Scan(&dl.Feed, &id, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created, &dl.Reason, &failed); err != nil {
			return nil, err
		}
		// A dead letter is shown even if it is malformed: it may be here
		// precisely because it was.
		if u, err := uuid.FromBytes(id); err == nil {
			ev.ID = u
		}
		_ = decodeHeaders(ev, headers)
		ev.CreatedAt, dl.FailedAt = fromMicros(created), fromMicros(failed)
		out = append(out, dl)
	}
	return out, rows.Err()
}

// deadLetterWhere is the condition of a selection of dead letters: only
// the terms of the fields that are set, so that an index serves them (a
// key, a partition; a feed's partitions are matched along the list).
func deadLetterWhere(p *ferrydriver.ListDeadLettersParams) (string, []any) {
	terms := []string{"TRUE"}
	var args []any
	add := func(term string, arg ...any) { terms, args = append(terms, term), append(args, arg...) }
	exact, family := driverkit.FeedFilter(p.Feed)
	if exact != "" {
		add("feed = ?", exact)
	}
	if family != "" {
		add("(LEFT(feed, LENGTH(?)) = ? AND SUBSTRING(feed, LENGTH(?) + 1) REGEXP '^[0-9]+$')", family, family, family)
	}
	if p.Key != "" {
		add("k = ?", p.Key)
	}
	if p.Type != "" {
		add("type = ?", p.Type)
	}
	if p.Topic != "" {
		add("topic = ?", p.Topic)
	}
	if p.Reason != "" {
		add("LOCATE(?, reason) > 0", []byte(p.Reason))
	}
	if !p.Since.IsZero() {
		add("failed_at >= ?", micros(p.Since))
	}
	if !p.Until.IsZero() {
		add("failed_at < ?", micros(p.Until))
	}
	if len(p.EventIDs) > 0 {
		marks := make([]string, len(p.EventIDs))
		for i, id := range p.EventIDs {
			marks[i] = "?"
			args = append(args, id[:])
		}
		terms = append(terms, "event_id IN ("+strings.Join(marks, ", ")+")")
	}
	return strings.Join(terms, " AND "), args
}

// refsWhere is the condition of the named dead letters.
func refsWhere(refs []ferrydriver.DeadLetterRef) (string, []any) {
	marks := make([]string, len(refs))
	args := make([]any, 0, 2*len(refs))
	for i, r := range refs {
		marks[i] = "(?, ?)"
		args = append(args, r.Feed, r.EventID[:])
	}
	return "(feed, event_id) IN (" + strings.Join(marks, ", ") + ")", args
}

// ListDeadLetters implements ferrydriver.Store: newest failure first, then
// event ID, walking ferry_dead_letters_list_idx (or the key's index).
func (d *Driver) ListDeadLetters(ctx context.Context, p *ferrydriver.ListDeadLettersParams) ([]*ferrydriver.DeadLetter, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	where, args := deadLetterWhere(p)
	if c := p.After; c != nil {
		where += " AND (failed_at < ? OR (failed_at = ? AND event_id > ?))"
		args = append(args, micros(c.FailedAt), micros(c.FailedAt), c.EventID[:])
	}
	rows, err := d.db.QueryContext(ctx, `SELECT `+deadLetterColumns+` FROM ferry_dead_letters WHERE `+where+
		` ORDER BY failed_at DESC, event_id LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, d.wrapErr("list dead letters", err)
	}
	out, err := scanDeadLetters(rows)
	return out, d.wrapErr("list dead letters", err)
}

// CountDeadLetters implements ferrydriver.Store.
func (d *Driver) CountDeadLetters(ctx context.Context, p *ferrydriver.ListDeadLettersParams) (int64, error) {
	where, args := deadLetterWhere(p)
	var n int64
	err := d.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM ferry_dead_letters WHERE `+where, args...).Scan(&n)
	return n, d.wrapErr("count dead letters", err)
}

// GetDeadLetter implements ferrydriver.Store.
func (d *Driver) GetDeadLetter(ctx context.Context, p *ferrydriver.GetDeadLetterParams) (*ferrydriver.DeadLetter, error) {
	where, args := deadLetterWhere(&ferrydriver.ListDeadLettersParams{Feed: p.Feed, EventIDs: []uuid.UUID{p.EventID}})
	rows, err := d.db.QueryContext(ctx, `SELECT `+deadLetterColumns+` FROM ferry_dead_letters WHERE `+where+` ORDER BY failed_at DESC LIMIT 1`, args...)
	if err != nil {
		return nil, d.wrapErr("read dead letter", err)
	}
	out, err := scanDeadLetters(rows)
	if err != nil {
		return nil, d.wrapErr("read dead letter", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("ferrymysql: dead letter %s: %w", p.EventID, ferrydriver.ErrNotFound)
	}
	return out[0], nil
}

// RedriveDeadLetters implements ferrydriver.Store: in one transaction, the
// named dead letters (locked) are checked, appended to their keys' parked
// queues in their feeds, marked redriven, and deleted.
func (d *Driver) RedriveDeadLetters(ctx context.Context, p *ferrydriver.DeadLetterSelection) (int, error) {
	if len(p.Letters) == 0 {
		return 0, nil
	}
	var n int
	err := d.write(ctx, "redrive dead letters", func(tx *sql.Tx) error {
		where, args := refsWhere(p.Letters)
		rows, err := tx.QueryContext(ctx, `SELECT `+deadLetterColumns+` FROM ferry_dead_letters WHERE `+where+
			` ORDER BY failed_at, seq, event_id FOR UPDATE`, args...)
		if err != nil {
			return d.wrapErr("select dead letters to redrive", err)
		}
		dls, err := scanDeadLetters(rows)
		if err != nil {
			return d.wrapErr("select dead letters to redrive", err)
		}
		for _, dl := range dls {
			ev := dl.Event
			// No size limit: the event was accepted once, under the producer's.
			if err := ferryevent.Validate(&ev, 0, math.MaxInt); err != nil || ev.ID == uuid.Nil {
				return fmt.Errorf("ferrymysql: dead letter %s of feed %s is not a valid event (%v): nothing was redriven; discard it (ferry dlq discard --feed %s %s)",
					ev.ID, dl.Feed, err, dl.Feed, ev.ID)
			}
		}
		for _, dl := range dls { // oldest failure first, each key in order
			if _, err := tx.ExecContext(ctx, `
INSERT INTO ferry_parked (feed, k, event_id, topic, seq, type, source, content_type, headers, payload, created_at, parked_at, reason, redriven)
SELECT feed, k, event_id, topic, seq, type, source, content_type, headers, payload, created_at, `+sqlNow+`,
       CONCAT('redriven by an operator after: ', reason), TRUE
  FROM ferry_dead_letters WHERE feed = ? AND event_id = ?
ON DUPLICATE KEY UPDATE feed = ferry_parked.feed`, dl.Feed, dl.Event.ID[:]); err != nil {
				return d.wrapErr("park redriven dead letters for their feeds", err)
			}
		}
		if len(dls) > 0 {
			where, args = refsWhere(driverkit.Refs(dls))
			if _, err := tx.ExecContext(ctx, `DELETE FROM ferry_dead_letters WHERE `+where, args...); err != nil {
				return d.wrapErr("delete redriven dead letters", err)
			}
		}
		n = len(dls)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// DiscardDeadLetters implements ferrydriver.Store.
func (d *Driver) DiscardDeadLetters(ctx context.Context, p *ferrydriver.DeadLetterSelection) (int, error) {
	if len(p.Letters) == 0 {
		return 0, nil
	}
	where, args := refsWhere(p.Letters)
	res, err := d.db.ExecContext(ctx, `DELETE FROM ferry_dead_letters WHERE `+where, args...)
	if err != nil {
		return 0, d.wrapErr("discard dead letters", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// DeleteDeadLetters implements ferrydriver.Store: the oldest of a feed's
// expired dead letters, a range of ferry_dead_letters_feed_idx.
func (d *Driver) DeleteDeadLetters(ctx context.Context, p *ferrydriver.DeleteDeadLettersParams) (int64, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 10000
	}
	res, err := d.db.ExecContext(ctx, `DELETE FROM ferry_dead_letters WHERE feed = ? AND failed_at < `+sqlNow+` - ? ORDER BY failed_at LIMIT ?`,
		p.Feed, p.OlderThan.Microseconds(), limit)
	if err != nil {
		return 0, d.wrapErr("delete old dead letters of "+p.Feed, err)
	}
	n, _ := res.RowsAffected()
	return n, nil
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
	cp, err := d.LoadCheckpoint(ctx, &ferrydriver.LoadCheckpointParams{Feed: p.Feed})
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
	cp, err := d.LoadCheckpoint(ctx, &ferrydriver.LoadCheckpointParams{Feed: p.Feed})
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

// ListLeases implements ferrydriver.Store.
func (d *Driver) ListLeases(ctx context.Context, prefix string) ([]*ferrydriver.Lease, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT name, holder, term, expires_at, `+sqlNow+` FROM ferry_leases WHERE term > 0 AND LEFT(name, LENGTH(?)) = ? ORDER BY name`,
		prefix, prefix)
	if err != nil {
		return nil, d.wrapErr("list leases", err)
	}
	defer rows.Close()
	var out []*ferrydriver.Lease
	for rows.Next() {
		l := &ferrydriver.Lease{}
		var expires, now int64
		if err := rows.Scan(&l.Name, &l.Holder, &l.Term, &expires, &now); err != nil {
			return nil, d.wrapErr("list leases", err)
		}
		l.ExpiresAt, l.Now = fromMicros(expires), fromMicros(now)
		out = append(out, l)
	}
	return out, d.wrapErr("list leases", rows.Err())
}
