package ferrysqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// cursor is a feed position: every event of the partition with an id at or
// below After has been read.
type cursor struct {
	After int64 `json:"after"`
}

func decodeCursor(b []byte) (cursor, error) {
	var c cursor
	if len(b) == 0 {
		return c, nil
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("ferrysqlite: the saved feed position %q is not a SQLite feed cursor (was it saved by another backend?): %w", b, err)
	}
	return c, nil
}

func (c cursor) encode() []byte {
	b, _ := json.Marshal(c)
	return b
}

// dataVersionInterval is how often a waiting feed asks SQLite whether
// another process committed. Commits through this driver wake it at once.
const dataVersionInterval = 20 * time.Millisecond

type feed struct {
	d         *Driver
	db        *sql.DB // a handle of its own, so feeds never use up the read pool
	conn      *sql.Conn
	partition int
	pos       cursor
	version   int64
}

// OpenFeed implements ferrydriver.Store. The feed holds one connection of
// the read handle until Close.
func (d *Driver) OpenFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) (ferrydriver.Feed, error) {
	if err := d.checkFeed(ctx, p); err != nil {
		return nil, err
	}
	pos, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(d.rconn)
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		_ = db.Close()
		return nil, d.wrapErr("open feed "+p.Feed, err)
	}
	f := &feed{d: d, db: db, conn: conn, partition: p.Partition, pos: pos}
	if f.version, err = f.dataVersion(ctx); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

func (f *feed) dataVersion(ctx context.Context) (int64, error) {
	var v int64
	if err := f.conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v); err != nil {
		return 0, f.d.wrapErr("read data_version", err)
	}
	return v, nil
}

const sqlFeedRead = `
SELECT id, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at
  FROM ferry_outbox WHERE partition = ? AND id > ? ORDER BY id LIMIT ?`

// Read implements ferrydriver.Feed.
func (f *feed) Read(ctx context.Context, p *ferrydriver.ReadParams) (*ferrydriver.Batch, error) {
	deadline := time.Now().Add(p.Wait)
	var tick *time.Ticker
	for {
		wake := f.d.events.changed()
		b, err := f.read(ctx, max(p.Max, 1))
		if err != nil {
			return nil, err
		}
		if len(b.Events)+len(b.Invalid) > 0 || !time.Now().Before(deadline) {
			if tick != nil {
				tick.Stop()
			}
			return b, nil
		}
		if tick == nil {
			tick = time.NewTicker(dataVersionInterval)
		}
		if err := f.wait(ctx, wake, tick.C, deadline); err != nil {
			tick.Stop()
			return nil, err
		}
	}
}

// wait returns when this process committed, another process committed
// (data_version moved), or the deadline passed.
func (f *feed) wait(ctx context.Context, wake <-chan struct{}, tick <-chan time.Time, deadline time.Time) error {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
			if v, err := f.dataVersion(ctx); err == nil {
				f.version = v // this process's commit: no second look at the next tick
			}
			return nil
		case <-timer.C:
			return nil
		case <-tick:
			v, err := f.dataVersion(ctx)
			if err != nil {
				return err
			}
			if v != f.version {
				f.version = v
				return nil
			}
		}
	}
}

func (f *feed) read(ctx context.Context, limit int) (*ferrydriver.Batch, error) {
	rows, err := f.conn.QueryContext(ctx, sqlFeedRead, f.partition, f.pos.After, limit)
	if err != nil {
		return nil, f.d.wrapErr("read feed", err)
	}
	defer rows.Close()
	b := &ferrydriver.Batch{}
	pos := f.pos // moved only once the whole batch was read
	for rows.Next() {
		var id int64
		ev := &ferryevent.Event{}
		var eventID string
		var headers sql.NullString
		var created int64
		if err := rows.Scan(&id, &eventID, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created); err != nil {
			return nil, f.d.wrapErr("read feed", err)
		}
		ev.CreatedAt = fromMicros(created)
		pos.After = id
		if err := ev.ID.UnmarshalText([]byte(eventID)); err != nil {
			b.Invalid = append(b.Invalid, &ferrydriver.InvalidRecord{Event: *ev, Reason: "invalid outbox row: event id " + eventID + ": " + err.Error()})
			continue
		}
		if err := decodeHeaders(ev, headers); err != nil {
			b.Invalid = append(b.Invalid, &ferrydriver.InvalidRecord{Event: *ev, Reason: "invalid outbox row: " + err.Error()})
			continue
		}
		if err := ferryevent.CheckRelayable(ev); err != nil {
			b.Invalid = append(b.Invalid, &ferrydriver.InvalidRecord{Event: *ev, Reason: "invalid outbox row: " + err.Error()})
			continue
		}
		b.Events = append(b.Events, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, f.d.wrapErr("read feed", err)
	}
	f.pos = pos
	b.Cursor = f.pos.encode()
	return b, nil
}

// Close implements ferrydriver.Feed.
func (f *feed) Close() error { return errors.Join(f.conn.Close(), f.db.Close()) }
