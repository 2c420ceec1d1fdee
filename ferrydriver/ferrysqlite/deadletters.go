package ferrysqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
)

// InsertDeadLetters implements ferrydriver.Store.
func (d *Driver) InsertDeadLetters(ctx context.Context, p *ferrydriver.InsertDeadLettersParams) error {
	return d.write(ctx, "insert dead letters of "+p.Feed, func(tx *sql.Tx) error {
		t := now()
		ok, err := holds(ctx, tx, p.Feed, p.Holder, p.Term, t)
		if err != nil {
			return d.wrapErr("insert dead letters of "+p.Feed, err)
		}
		if !ok {
			return fmt.Errorf("ferrysqlite: insert dead letters of %s at term %d: %w", p.Feed, p.Term, ferrydriver.ErrLeaseLost)
		}
		for _, dl := range p.DeadLetters {
			ev := &dl.Event
			c, err := encodeEvent(ev)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `
INSERT INTO ferry_dead_letters (feed, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at, reason, failed_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (feed, event_id) DO NOTHING`,
				p.Feed, c.id, ev.Topic, ev.Key, ev.Seq, ev.Type, ev.Source, ev.ContentType, c.headers, c.payload, micros(ev.CreatedAt), dl.Reason, micros(t)); err != nil {
				return d.wrapErr("insert dead letters of "+p.Feed, err)
			}
		}
		return nil
	})
}

func (d *Driver) scanDeadLetters(rows *sql.Rows) ([]*ferrydriver.DeadLetter, error) {
	defer rows.Close()
	var out []*ferrydriver.DeadLetter
	for rows.Next() {
		dl := &ferrydriver.DeadLetter{}
		ev := &dl.Event
		var id string
		var headers sql.NullString
		var created, failed int64
		if err := rows.Scan(&dl.Feed, &id, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created, &dl.Reason, &failed); err != nil {
			return nil, err
		}
		// A dead letter is shown even if it is malformed: it may be here
		// precisely because it was.
		_ = ev.ID.UnmarshalText([]byte(id))
		_ = decodeHeaders(ev, headers)
		ev.CreatedAt, dl.FailedAt = fromMicros(created), fromMicros(failed)
		out = append(out, dl)
	}
	return out, rows.Err()
}

// ListDeadLetters implements ferrydriver.Store.
func (d *Driver) ListDeadLetters(ctx context.Context, p *ferrydriver.ListDeadLettersParams) ([]*ferrydriver.DeadLetter, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	var afterAt any
	afterID := uuid.Nil.String()
	if p.After != nil {
		afterAt, afterID = nullMicros(p.After.FailedAt), p.After.EventID.String()
	}
	rows, err := d.r.QueryContext(ctx, listDeadLetters(p), append(deadLetterArgs(p), limit, afterAt, afterID)...)
	if err != nil {
		return nil, d.wrapErr("list dead letters", err)
	}
	out, err := d.scanDeadLetters(rows)
	return out, d.wrapErr("list dead letters", err)
}

// CountDeadLetters implements ferrydriver.Store.
func (d *Driver) CountDeadLetters(ctx context.Context, p *ferrydriver.ListDeadLettersParams) (int64, error) {
	var n int64
	// "?9 = ?9": the statement has the nine parameters bound, used or not.
	err := d.r.QueryRowContext(ctx, `SELECT count(*) FROM ferry_dead_letters WHERE `+deadLetterFilter(p)+` AND ?9 = ?9`, deadLetterArgs(p)...).Scan(&n)
	return n, d.wrapErr("count dead letters", err)
}

// deadLetterFilter selects dead letters by feed ?1 (a partition, exactly)
// or ?9 (a feed's partitions: the prefix "<feed>/" then a number), key
// ?2, type ?3, topic ?4, failed at or after ?5 and before ?6, the event
// IDs of the JSON array ?7, and a reason containing ?8. Only the terms of
// the fields that are set are written, so that an index serves them (a
// key: ferry_dead_letters_key_idx, migration 12; a partition: the index
// on (feed, failed_at)): "(?2 = ” OR key = ?2)" could be served by none,
// and a page of a key's dead letters walked them all. The parameters of
// the others are bound all the same, unused.
func deadLetterFilter(p *ferrydriver.ListDeadLettersParams) string {
	exact, family := driverkit.FeedFilter(p.Feed)
	terms := []string{`(?7 = '[]' OR event_id IN (SELECT value FROM json_each(?7)))`}
	for _, t := range []struct {
		set  bool
		term string
	}{{exact != "", `feed = ?1`}, {p.Key != "", `key = ?2`}, {p.Type != "", `type = ?3`}, {p.Topic != "", `topic = ?4`},
		{!p.Since.IsZero(), `failed_at >= ?5`}, {!p.Until.IsZero(), `failed_at < ?6`}, {p.Reason != "", `instr(reason, ?8) > 0`},
		{family != "", familyTerm}} {
		if t.set {
			terms = append(terms, t.term)
		}
	}
	return strings.Join(terms, " AND ")
}

// listDeadLetters lists dead letters newest failure first, after the
// cursor (?11, ?12), ?10 at most, walking ferry_dead_letters_list_idx
// (migration 8) or the index of the filter.
// The cursor's term too is written only when there is one: "?11 IS NULL
// OR ..." made a deep page walk the index from its start.
func listDeadLetters(p *ferrydriver.ListDeadLettersParams) string {
	after := `?11 IS NULL AND ?12 = ?12`
	if p.After != nil {
		after = `failed_at <= ?11 AND (failed_at < ?11 OR event_id > ?12)`
	}
	return `SELECT ` + deadLetterColumns + ` FROM ferry_dead_letters
 WHERE ` + deadLetterFilter(p) + ` AND ` + after + `
 ORDER BY failed_at DESC, event_id LIMIT ?10`
}

// deadLetterArgs are the parameters ?1 to ?9 of deadLetterFilter.
func deadLetterArgs(p *ferrydriver.ListDeadLettersParams) []any {
	exact, family := driverkit.FeedFilter(p.Feed)
	list := make([]string, len(p.EventIDs))
	for i, id := range p.EventIDs {
		list[i] = id.String()
	}
	js, _ := json.Marshal(list)
	return []any{exact, p.Key, p.Type, p.Topic, nullMicros(p.Since), nullMicros(p.Until), string(js), p.Reason, family}
}

// RedriveDeadLetters implements ferrydriver.Store: in one write
// transaction, the named dead letters are checked, appended to their
// keys' parked queues in their feeds, marked redriven, and deleted.
func (d *Driver) RedriveDeadLetters(ctx context.Context, refs []ferrydriver.DeadLetterRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	var n int
	err := d.write(ctx, "redrive dead letters", func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT `+deadLetterColumns+` FROM ferry_dead_letters
 WHERE (feed, event_id) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?))
 ORDER BY failed_at, seq, event_id`, refsJSON(refs))
		if err != nil {
			return d.wrapErr("select dead letters to redrive", err)
		}
		defer rows.Close()
		type row struct{ feed, id string }
		var selected []row
		for rows.Next() {
			dl := &ferrydriver.DeadLetter{}
			ev := &dl.Event
			var id string
			var headers sql.NullString
			var created, failed int64
			if err := rows.Scan(&dl.Feed, &id, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created, &dl.Reason, &failed); err != nil {
				return d.wrapErr("select dead letters to redrive", err)
			}
			err := ev.ID.UnmarshalText([]byte(id))
			if err == nil {
				err = decodeHeaders(ev, headers)
			}
			if err == nil {
				// No size limit: the event was accepted once, under the producer's.
				err = ferryevent.Validate(ev, 0, math.MaxInt)
			}
			if err != nil {
				return fmt.Errorf("ferrysqlite: dead letter %s of feed %s is not a valid event (%v): nothing was redriven; discard it (ferry dlq discard --feed %s %s)",
					id, dl.Feed, err, dl.Feed, id)
			}
			selected = append(selected, row{dl.Feed, id})
		}
		if err := rows.Err(); err != nil {
			return d.wrapErr("select dead letters to redrive", err)
		}
		rows.Close()
		at := micros(now())
		for _, r := range selected { // oldest failure first, each key in order
			if _, err := tx.ExecContext(ctx, `
INSERT INTO ferry_parked (feed, key, event_id, topic, seq, type, source, content_type, headers, payload, created_at, parked_at, reason, redriven)
SELECT feed, key, event_id, topic, seq, type, source, content_type, headers, payload, created_at, ?, 'redriven by an operator after: ' || reason, 1
  FROM ferry_dead_letters WHERE feed = ? AND event_id = ?
ON CONFLICT (feed, event_id) DO NOTHING`, at, r.feed, r.id); err != nil {
				return d.wrapErr("park redriven dead letters for their feeds", err)
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM ferry_dead_letters WHERE feed = ? AND event_id = ?`, r.feed, r.id); err != nil {
				return d.wrapErr("delete redriven dead letters", err)
			}
		}
		n = len(selected)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// refsJSON is the named dead letters as a JSON array of [feed, event ID].
func refsJSON(refs []ferrydriver.DeadLetterRef) string {
	pairs := make([][2]string, len(refs))
	for i, r := range refs {
		pairs[i] = [2]string{r.Feed, r.EventID.String()}
	}
	js, _ := json.Marshal(pairs)
	return string(js)
}

// DiscardDeadLetters implements ferrydriver.Store.
func (d *Driver) DiscardDeadLetters(ctx context.Context, refs []ferrydriver.DeadLetterRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	var n int64
	err := d.write(ctx, "discard dead letters", func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM ferry_dead_letters
 WHERE (feed, event_id) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?))`, refsJSON(refs))
		if err != nil {
			return d.wrapErr("discard dead letters", err)
		}
		n, _ = res.RowsAffected()
		return nil
	})
	return int(n), err
}

// GetDeadLetter implements ferrydriver.Store.
func (d *Driver) GetDeadLetter(ctx context.Context, p ferrydriver.DeadLetterRef) (*ferrydriver.DeadLetter, error) {
	exact, family := driverkit.FeedFilter(p.Feed)
	rows, err := d.r.QueryContext(ctx, `SELECT `+deadLetterColumns+` FROM ferry_dead_letters
 WHERE (?1 = '' OR feed = ?1) AND event_id = ?2 AND (?9 = '' OR `+familyTerm+`) ORDER BY failed_at DESC LIMIT 1`,
		exact, p.EventID.String(), nil, nil, nil, nil, nil, nil, family)
	if err != nil {
		return nil, d.wrapErr("read dead letter", err)
	}
	out, err := d.scanDeadLetters(rows)
	if err != nil {
		return nil, d.wrapErr("read dead letter", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("ferrysqlite: dead letter %s: %w", p.EventID, ferrydriver.ErrNotFound)
	}
	return out[0], nil
}

// DeleteDeadLetters implements ferrydriver.Store: a range of
// ferry_dead_letters_feed_failed_at_idx (migration 005).
func (d *Driver) DeleteDeadLetters(ctx context.Context, p *ferrydriver.DeleteDeadLettersParams) (int64, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 10000
	}
	var n int64
	err := d.write(ctx, "delete old dead letters of "+p.Feed, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `
DELETE FROM ferry_dead_letters WHERE rowid IN (
    SELECT rowid FROM ferry_dead_letters WHERE feed = ? AND failed_at < ? ORDER BY failed_at LIMIT ?)`,
			p.Feed, micros(now())-p.OlderThan.Microseconds(), limit)
		if err != nil {
			return d.wrapErr("delete old dead letters of "+p.Feed, err)
		}
		n, _ = res.RowsAffected()
		return nil
	})
	return n, err
}
