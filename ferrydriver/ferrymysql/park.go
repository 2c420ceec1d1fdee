package ferrymysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
)

const parkedColumns = `event_id, topic, k, seq, type, source, content_type, headers, payload, created_at, parked_at, held, reason, redriven, attempts, first_failure`

// ParkEvents implements ferrydriver.Store.
func (d *Driver) ParkEvents(ctx context.Context, p *ferrydriver.ParkEventsParams) error {
	if len(p.Events) == 0 {
		return nil
	}
	return d.fencedWrite(ctx, "park events", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		for _, ev := range p.Events {
			c, err := encodeEvent(ev)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `
INSERT INTO ferry_parked (feed, k, event_id, topic, seq, type, source, content_type, headers, payload, created_at, parked_at, reason)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, `+sqlNow+`, ?) ON DUPLICATE KEY UPDATE feed = feed`,
				p.Feed, ev.Key, c.id, ev.Topic, ev.Seq, ev.Type, ev.Source, ev.ContentType, c.headers, c.payload, micros(ev.CreatedAt), p.Reason); err != nil {
				return d.wrapErr("park events of "+p.Feed, err)
			}
		}
		return nil
	})
}

// ParkedHeads implements ferrydriver.Store.
func (d *Driver) ParkedHeads(ctx context.Context, p *ferrydriver.ParkedHeadsParams) ([]*ferrydriver.ParkedEvent, error) {
	var out []*ferrydriver.ParkedEvent
	scan := func(rows *sql.Rows, withQueued bool) error {
		defer rows.Close()
		for rows.Next() {
			pe := &ferrydriver.ParkedEvent{Feed: p.Feed}
			ev := &pe.Event
			var id, headers []byte
			var created, parked, firstFailure int64
			dest := []any{&id, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created, &parked, &pe.Held, &pe.Reason, &pe.Redriven,
				&pe.Attempts, &firstFailure}
			if withQueued {
				dest = append(dest, &pe.Queued)
			}
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			u, err := uuid.FromBytes(id)
			if err != nil {
				return fmt.Errorf("parked event ID %x: %w", id, err)
			}
			ev.ID = u
			if err := decodeHeaders(ev, headers); err != nil {
				return err
			}
			ev.CreatedAt, pe.ParkedAt = fromMicros(created), fromMicros(parked)
			if firstFailure != 0 {
				pe.FirstFailure = fromMicros(firstFailure)
			}
			out = append(out, pe)
		}
		return rows.Err()
	}
	keys := p.Keys
	if keys == nil && p.Redriven {
		// The keys with redriven events (ferry_parked_redriven_idx,
		// migration 3), then their heads.
		var err error
		if keys, err = d.redrivenKeys(ctx, p.Feed, p.Limit); err != nil {
			return nil, d.wrapErr("read redriven events of "+p.Feed, err)
		}
	}
	if keys != nil {
		// One index probe per key, whatever the length of its queue.
		for _, key := range keys {
			rows, err := d.db.QueryContext(ctx, `SELECT `+parkedColumns+` FROM ferry_parked WHERE feed = ? AND k = ? ORDER BY id LIMIT 1`, p.Feed, key)
			if err != nil {
				return nil, d.wrapErr("read parked events of "+p.Feed, err)
			}
			if err := scan(rows, false); err != nil {
				return nil, d.wrapErr("read parked events of "+p.Feed, err)
			}
		}
		return out, nil
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	rows, err := d.db.QueryContext(ctx, `
SELECT `+parkedColumns+`, h.n FROM ferry_parked
  JOIN (SELECT MIN(id) AS head, COUNT(*) AS n FROM ferry_parked WHERE feed = ? GROUP BY k) h ON id = h.head
 ORDER BY parked_at, k LIMIT ?`, p.Feed, limit)
	if err != nil {
		return nil, d.wrapErr("read parked events of "+p.Feed, err)
	}
	if err := scan(rows, true); err != nil {
		return nil, d.wrapErr("read parked events of "+p.Feed, err)
	}
	return out, nil
}

// redrivenKeys returns the keys of feed with a redriven event, at most
// limit (0: 1000).
func (d *Driver) redrivenKeys(ctx context.Context, feed string, limit int) ([]string, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := d.db.QueryContext(ctx, `SELECT DISTINCT k FROM ferry_parked WHERE feed = ? AND redriven LIMIT ?`, feed, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	keys := []string{}
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, string(k))
	}
	return keys, rows.Err()
}

// UnparkEvent implements ferrydriver.Store.
func (d *Driver) UnparkEvent(ctx context.Context, p *ferrydriver.UnparkEventParams) error {
	return d.fencedWrite(ctx, "unpark an event", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		if p.DeadLetter != nil {
			if err := moveToDeadLetters(ctx, tx, p.Feed, p.EventID, p.DeadLetter.Reason); err != nil {
				return d.wrapErr("dead-letter a parked event of "+p.Feed, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM ferry_parked WHERE feed = ? AND event_id = ?`, p.Feed, p.EventID[:]); err != nil {
			return d.wrapErr("unpark an event of "+p.Feed, err)
		}
		return nil
	})
}

// moveToDeadLetters copies a parked event into the dead letters.
func moveToDeadLetters(ctx context.Context, tx *sql.Tx, feed string, eventID uuid.UUID, reason string) error {
	_, err := tx.ExecContext(ctx, `
INSERT INTO ferry_dead_letters (feed, event_id, topic, k, seq, type, source, content_type, headers, payload, created_at, reason, failed_at)
SELECT feed, event_id, topic, k, seq, type, source, content_type, headers, payload, created_at, ?, `+sqlNow+`
  FROM ferry_parked WHERE feed = ? AND event_id = ?
ON DUPLICATE KEY UPDATE feed = ferry_dead_letters.feed`, reason, feed, eventID[:])
	return err
}

// HoldParked implements ferrydriver.Store.
func (d *Driver) HoldParked(ctx context.Context, p *ferrydriver.HoldParkedParams) error {
	return d.fencedWrite(ctx, "hold a parked key", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE ferry_parked SET held = TRUE, reason = ? WHERE feed = ? AND event_id = ?`, p.Reason, p.Feed, p.EventID[:])
		return d.wrapErr("hold a parked key of "+p.Feed, err)
	})
}

// SetParkedAttempts implements ferrydriver.Store.
func (d *Driver) SetParkedAttempts(ctx context.Context, p *ferrydriver.SetParkedAttemptsParams) error {
	var first int64
	if !p.FirstFailure.IsZero() {
		first = p.FirstFailure.UnixMicro()
	}
	return d.fencedWrite(ctx, "record the attempts of a parked key", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE ferry_parked SET attempts = ?, first_failure = ? WHERE feed = ? AND event_id = ?`, p.Attempts, first, p.Feed, p.EventID[:])
		return d.wrapErr("record the attempts of a parked key of "+p.Feed, err)
	})
}

// ReleaseParked implements ferrydriver.Store.
func (d *Driver) ReleaseParked(ctx context.Context, p *ferrydriver.ReleaseParkedParams) error {
	return d.write(ctx, "release parked key "+p.Key+" of "+p.Feed, func(tx *sql.Tx) error {
		var id []byte
		var reason string
		err := tx.QueryRowContext(ctx, `SELECT event_id, reason FROM ferry_parked WHERE feed = ? AND k = ? ORDER BY id LIMIT 1 FOR UPDATE`, p.Feed, p.Key).Scan(&id, &reason)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("ferrymysql: key %q of feed %s has nothing parked: %w", p.Key, p.Feed, ferrydriver.ErrNotFound)
		}
		if err != nil {
			return d.wrapErr("release parked key "+p.Key, err)
		}
		if !p.Skip {
			_, err = tx.ExecContext(ctx, `UPDATE ferry_parked SET held = FALSE, attempts = 0, first_failure = 0 WHERE feed = ? AND event_id = ?`, p.Feed, id)
			return d.wrapErr("release parked key "+p.Key, err)
		}
		u, err := uuid.FromBytes(id)
		if err != nil {
			return fmt.Errorf("ferrymysql: parked event ID %x: %w", id, err)
		}
		if err := moveToDeadLetters(ctx, tx, p.Feed, u, "skipped by an operator after: "+reason); err != nil {
			return d.wrapErr("release parked key "+p.Key, err)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM ferry_parked WHERE feed = ? AND event_id = ?`, p.Feed, id)
		return d.wrapErr("release parked key "+p.Key, err)
	})
}
