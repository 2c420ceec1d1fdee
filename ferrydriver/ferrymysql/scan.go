package ferrymysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// snapshot is a scan's consistent snapshot: a connection in a transaction
// started WITH CONSISTENT SNAPSHOT, the binlog position that snapshot
// corresponds to (every transaction committed before it is visible in the
// snapshot, none after), and how far the scan got.
type snapshot struct {
	conn     *sql.Conn
	file     string
	pos      uint32
	afterK   []byte
	afterSeq int64
	started  bool
	scanned  int64
}

// scan returns the next rows of the outbox scan, key by key in Seq order;
// the batch that ends it carries the snapshot's binlog position, from
// which the feed follows the binlog.
func (f *feed) scan(ctx context.Context, limit int) (*ferrydriver.Batch, error) {
	if f.snap == nil {
		if err := f.beginSnapshot(ctx); err != nil {
			return nil, err
		}
	}
	s := f.snap
	q := `SELECT id, event_id, topic, k, seq, type, source, content_type, headers, payload, created_at, appended_at
  FROM ferry_outbox WHERE p = ? AND appended_at >= ?`
	args := []any{f.partition, f.pos.Scan.From}
	if s.started {
		q += ` AND (k > ? OR (k = ? AND seq > ?))`
		args = append(args, s.afterK, s.afterK, s.afterSeq)
	}
	q += ` ORDER BY k, seq LIMIT ?`
	rows, err := s.conn.QueryContext(ctx, q, append(args, limit)...)
	if err != nil {
		f.endSnapshot()
		return nil, f.d.wrapErr("scan the outbox ("+f.name+")", err)
	}
	b := &ferrydriver.Batch{}
	cur := f.pos
	n := 0
	for rows.Next() {
		var id, created, appended int64
		var eventID, headers []byte
		ev := &ferryevent.Event{}
		var key []byte
		if err := rows.Scan(&id, &eventID, &ev.Topic, &key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created, &appended); err != nil {
			rows.Close()
			f.endSnapshot()
			return nil, f.d.wrapErr("scan the outbox ("+f.name+")", err)
		}
		n++
		ev.Key, ev.CreatedAt = string(key), fromMicros(created)
		if ev.Payload == nil {
			ev.Payload = []byte{}
		}
		s.afterK, s.afterSeq, s.started = key, ev.Seq, true
		cur.At = max(cur.At, appended)
		u, err := uuid.FromBytes(eventID)
		if err == nil {
			ev.ID = u
			err = decodeHeaders(ev, headers)
		}
		if err == nil {
			err = ferryevent.CheckRelayable(ev)
		}
		if err != nil {
			b.Invalid = append(b.Invalid, &ferrydriver.InvalidRecord{Event: *ev, Reason: fmt.Sprintf("invalid outbox row %d: %v", id, err)})
			continue
		}
		b.Events = append(b.Events, ev)
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		f.endSnapshot()
		return nil, f.d.wrapErr("scan the outbox ("+f.name+")", err)
	}
	rows.Close()
	s.scanned += int64(n)
	if n < limit {
		// Done: what committed after the snapshot is in the binlog from
		// its position.
		f.d.cfg.Logger.Info("ferrymysql: the outbox scan is done; the feed follows the binlog", "feed", f.name,
			"events", s.scanned, "file", s.file, "pos", s.pos)
		cur = cursor{V: 1, File: s.file, Pos: s.pos, At: cur.At}
		f.endSnapshot()
	}
	f.pos = cur
	b.Cursor = cur.encode()
	return b, nil
}

// beginSnapshot opens the scan's snapshot and reads its binlog position
// (MariaDB's binlog_snapshot_file and binlog_snapshot_position).
func (f *feed) beginSnapshot(ctx context.Context) error {
	conn, err := f.d.db.Conn(ctx)
	if err != nil {
		return f.d.wrapErr("scan the outbox ("+f.name+")", err)
	}
	fail := func(err error) error {
		_ = conn.Close()
		return f.d.wrapErr("start the outbox scan ("+f.name+")", err)
	}
	if _, err := conn.ExecContext(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		return fail(err)
	}
	if _, err := conn.ExecContext(ctx, `START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`); err != nil {
		return fail(err)
	}
	rows, err := conn.QueryContext(ctx, `SHOW STATUS LIKE 'binlog_snapshot_%'`)
	if err != nil {
		return fail(err)
	}
	s := &snapshot{conn: conn}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			rows.Close()
			return fail(err)
		}
		switch name {
		case "Binlog_snapshot_file", "binlog_snapshot_file":
			s.file = value
		case "Binlog_snapshot_position", "binlog_snapshot_position":
			var p uint64
			if _, err := fmt.Sscan(value, &p); err != nil {
				rows.Close()
				return fail(fmt.Errorf("binlog_snapshot_position %q: %w", value, err))
			}
			s.pos = uint32(p)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	if s.file == "" {
		_ = conn.Close()
		return fmt.Errorf("ferrymysql: start the outbox scan (%s): %w: the server gives no binlog position for a snapshot (binlog_snapshot_file): it needs the binlog on (log-bin) and MariaDB 10.6 or later",
			f.name, ferrydriver.ErrMisconfigured)
	}
	f.snap = s
	f.d.cfg.Logger.Info("ferrymysql: the feed scans the outbox of its partition", "feed", f.name, "partition", f.partition,
		"from", fromMicros(f.pos.Scan.From), "binlog_file", s.file, "binlog_pos", s.pos)
	return nil
}

func (f *feed) endSnapshot() {
	if f.snap == nil {
		return
	}
	_, _ = f.snap.conn.ExecContext(context.Background(), `COMMIT`)
	_ = f.snap.conn.Close()
	f.snap = nil
}
