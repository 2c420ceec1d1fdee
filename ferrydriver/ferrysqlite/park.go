package ferrysqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
)

const parkedColumns = `event_id, topic, key, seq, type, source, content_type, headers, payload, created_at, parked_at, held, reason, redriven, attempts, first_failure`

// fencedWrite runs fn in a write transaction if holder holds feed's lease
// at term.
func (d *Driver) fencedWrite(ctx context.Context, op, feed, holder string, term int64, fn func(tx *sql.Tx) error) error {
	return d.write(ctx, op+" of "+feed, func(tx *sql.Tx) error {
		ok, err := holds(ctx, tx, feed, holder, term, now())
		if err != nil {
			return d.wrapErr(op+" of "+feed, err)
		}
		if !ok {
			return fmt.Errorf("ferrysqlite: %s of %s at term %d: %w", op, feed, term, ferrydriver.ErrLeaseLost)
		}
		return fn(tx)
	})
}

// ParkEvents implements ferrydriver.Store.
func (d *Driver) ParkEvents(ctx context.Context, p *ferrydriver.ParkEventsParams) error {
	if len(p.Events) == 0 {
		return nil
	}
	return d.fencedWrite(ctx, "park events", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		t := micros(now())
		for _, ev := range p.Events {
			c, err := encodeEvent(ev)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `
INSERT INTO ferry_parked (feed, key, event_id, topic, seq, type, source, content_type, headers, payload, created_at, parked_at, reason)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (feed, event_id) DO NOTHING`,
				p.Feed, ev.Key, c.id, ev.Topic, ev.Seq, ev.Type, ev.Source, ev.ContentType, c.headers, c.payload, micros(ev.CreatedAt), t, p.Reason); err != nil {
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
			var id string
			var headers sql.NullString
			var created, parked, firstFailure int64
			dest := []any{&id, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created, &parked, &pe.Held, &pe.Reason, &pe.Redriven,
				&pe.Attempts, &firstFailure}
			if withQueued {
				dest = append(dest, &pe.Queued)
			}
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			if err := ev.ID.UnmarshalText([]byte(id)); err != nil {
				return fmt.Errorf("parked event ID %q: %w", id, err)
			}
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
		// migration 13), then their heads.
		var err error
		if keys, err = d.redrivenKeys(ctx, p.Feed, p.Limit); err != nil {
			return nil, d.wrapErr("read redriven events of "+p.Feed, err)
		}
	}
	if keys != nil {
		// One index probe per key, whatever the length of its queue.
		for _, key := range keys {
			rows, err := d.r.QueryContext(ctx, `SELECT `+parkedColumns+` FROM ferry_parked WHERE feed = ? AND key = ? ORDER BY id LIMIT 1`, p.Feed, key)
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
	rows, err := d.r.QueryContext(ctx, `
SELECT `+parkedColumns+`, n FROM ferry_parked
  JOIN (SELECT key AS k, min(id) AS head, count(*) AS n FROM ferry_parked WHERE feed = ? GROUP BY key) ON id = head
 ORDER BY parked_at, key LIMIT ?`, p.Feed, limit)
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
	rows, err := d.r.QueryContext(ctx, `SELECT DISTINCT key FROM ferry_parked WHERE feed = ? AND redriven = 1 LIMIT ?`, feed, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	keys := []string{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// UnparkEvent implements ferrydriver.Store.
func (d *Driver) UnparkEvent(ctx context.Context, p *ferrydriver.UnparkEventParams) error {
	return d.fencedWrite(ctx, "unpark an event", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		if p.DeadLetter != nil {
			if err := moveToDeadLetters(ctx, tx, p.Feed, p.EventID.String(), p.DeadLetter.Reason); err != nil {
				return d.wrapErr("dead-letter a parked event of "+p.Feed, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM ferry_parked WHERE feed = ? AND event_id = ?`, p.Feed, p.EventID.String()); err != nil {
			return d.wrapErr("unpark an event of "+p.Feed, err)
		}
		return nil
	})
}

// moveToDeadLetters copies a parked event into the dead letters.
func moveToDeadLetters(ctx context.Context, tx *sql.Tx, feed, eventID, reason string) error {
	_, err := tx.ExecContext(ctx, `
INSERT INTO ferry_dead_letters (feed, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at, reason, failed_at)
SELECT feed, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at, ?, ?
  FROM ferry_parked WHERE feed = ? AND event_id = ?
ON CONFLICT (feed, event_id) DO NOTHING`, reason, micros(now()), feed, eventID)
	return err
}

// HoldParked implements ferrydriver.Store.
func (d *Driver) HoldParked(ctx context.Context, p *ferrydriver.HoldParkedParams) error {
	return d.fencedWrite(ctx, "hold a parked key", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE ferry_parked SET held = 1, reason = ? WHERE feed = ? AND event_id = ?`, p.Reason, p.Feed, p.EventID.String())
		return d.wrapErr("hold a parked key of "+p.Feed, err)
	})
}

// SetParkedAttempts implements ferrydriver.Store.
func (d *Driver) SetParkedAttempts(ctx context.Context, p *ferrydriver.SetParkedAttemptsParams) error {
	var first int64
	if !p.FirstFailure.IsZero() {
		first = micros(p.FirstFailure)
	}
	return d.fencedWrite(ctx, "record the attempts of a parked key", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE ferry_parked SET attempts = ?, first_failure = ? WHERE feed = ? AND event_id = ?`, p.Attempts, first, p.Feed, p.EventID.String())
		return d.wrapErr("record the attempts of a parked key of "+p.Feed, err)
	})
}

// ReleaseParked implements ferrydriver.Store.
func (d *Driver) ReleaseParked(ctx context.Context, p *ferrydriver.ReleaseParkedParams) error {
	return d.write(ctx, "release parked key "+p.Key+" of "+p.Feed, func(tx *sql.Tx) error {
		var id, reason string
		err := tx.QueryRowContext(ctx, `SELECT event_id, reason FROM ferry_parked WHERE feed = ? AND key = ? ORDER BY id LIMIT 1`, p.Feed, p.Key).Scan(&id, &reason)
		if err == sql.ErrNoRows {
			return fmt.Errorf("ferrysqlite: key %q of feed %s has nothing parked: %w", p.Key, p.Feed, ferrydriver.ErrNotFound)
		}
		if err != nil {
			return d.wrapErr("release parked key "+p.Key, err)
		}
		if !p.Skip {
			_, err = tx.ExecContext(ctx, `UPDATE ferry_parked SET held = 0, attempts = 0, first_failure = 0 WHERE feed = ? AND event_id = ?`, p.Feed, id)
			return d.wrapErr("release parked key "+p.Key, err)
		}
		if err := moveToDeadLetters(ctx, tx, p.Feed, id, "skipped by an operator after: "+reason); err != nil {
			return d.wrapErr("release parked key "+p.Key, err)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM ferry_parked WHERE feed = ? AND event_id = ?`, p.Feed, id)
		return d.wrapErr("release parked key "+p.Key, err)
	})
}

// ListLeases implements ferrydriver.Store.
func (d *Driver) ListLeases(ctx context.Context, prefix string) ([]*ferrydriver.Lease, error) {
	at := now()
	rows, err := d.r.QueryContext(ctx, `SELECT name, holder, term, expires_at FROM ferry_leases WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name`, prefix)
	if err != nil {
		return nil, d.wrapErr("list leases "+prefix+"*", err)
	}
	defer rows.Close()
	var out []*ferrydriver.Lease
	for rows.Next() {
		l := &ferrydriver.Lease{Now: at}
		var expires int64
		if err := rows.Scan(&l.Name, &l.Holder, &l.Term, &expires); err != nil {
			return nil, d.wrapErr("list leases "+prefix+"*", err)
		}
		l.ExpiresAt = fromMicros(expires)
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("list leases "+prefix+"*", err)
	}
	return out, nil
}
