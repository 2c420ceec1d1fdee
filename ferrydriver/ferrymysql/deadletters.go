package ferrymysql

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"strings"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

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
func (d *Driver) GetDeadLetter(ctx context.Context, p ferrydriver.DeadLetterRef) (*ferrydriver.DeadLetter, error) {
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
func (d *Driver) RedriveDeadLetters(ctx context.Context, refs []ferrydriver.DeadLetterRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	var n int
	err := d.write(ctx, "redrive dead letters", func(tx *sql.Tx) error {
		where, args := refsWhere(refs)
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
func (d *Driver) DiscardDeadLetters(ctx context.Context, refs []ferrydriver.DeadLetterRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	where, args := refsWhere(refs)
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
