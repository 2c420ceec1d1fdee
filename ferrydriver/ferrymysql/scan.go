package ferrymysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"

	"github.com/ferry-dev/ferry/ferrydriver"
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
	// open is the start of the oldest transaction open before the
	// snapshot (0: not known): the cursor after the scan's Open.
	open int64
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
	q := `SELECT ` + outboxSelect + ` FROM ferry_outbox WHERE p = ? AND appended_at >= ?`
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
		r, err := scanRow(rows)
		if err != nil {
			rows.Close()
			f.endSnapshot()
			return nil, f.d.wrapErr("scan the outbox ("+f.name+")", err)
		}
		n++
		s.afterK, s.afterSeq, s.started = []byte(r.ev.Key), r.ev.Seq, true
		cur.At = max(cur.At, r.appended)
		if r.invalid != "" {
			b.Invalid = append(b.Invalid, &ferrydriver.InvalidRecord{Event: *r.ev, Reason: r.invalid})
			continue
		}
		b.Events = append(b.Events, r.ev)
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
		cur = cursor{V: 1, File: s.file, Pos: s.pos, At: cur.At, Open: max(cur.Open, s.open), Holds: cur.Holds}
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
	f.checkXA(ctx)
	// Every transaction committed after the snapshot was open before it
	// or started after.
	open, err := f.d.oldestOpen(ctx)
	if err != nil {
		open = 0 // the scan that follows resumes as before (the warning is the feed's, sampleOpen)
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
	s := &snapshot{conn: conn, open: open}
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

// checkXA compares the XA transactions prepared in the server, read
// before a scan's snapshot, with those the feed holds: a hold whose
// transaction is no longer prepared was committed (the snapshot sees its
// rows) or rolled back before the snapshot, and goes. A prepared one the
// feed does not hold is one whose PREPARE it did not read (the binlog
// that held it was purged, or the feed starts with a scan): the rows it
// wrote, invisible to the snapshot, will not be delivered when it
// commits. Nothing can find those rows; an operator can, with its XID.
func (f *feed) checkXA(ctx context.Context) {
	rows, err := f.d.db.QueryContext(ctx, `XA RECOVER`)
	if err != nil {
		f.d.cfg.Logger.Warn("ferrymysql: XA RECOVER failed: the outbox scan cannot tell whether an XA transaction prepared before it wrote events it will not deliver",
			"feed", f.name, "err", err)
		return
	}
	defer rows.Close()
	prepared := map[string]bool{}
	var unknown []string
	for rows.Next() {
		var format int64
		var gl, bl int
		var data []byte
		if err := rows.Scan(&format, &gl, &bl, &data); err != nil || gl+bl > len(data) {
			continue
		}
		xid := xaID(format, data[:gl], data[gl:gl+bl])
		prepared[xid] = true
		if !slices.ContainsFunc(f.pos.Holds, func(h xaHold) bool { return h.XID == xid }) {
			unknown = append(unknown, fmt.Sprintf("XA COMMIT X'%x',X'%x',%d", data[:gl], data[gl:gl+bl], format))
		}
	}
	if rows.Err() != nil {
		return
	}
	f.pos.Holds = slices.DeleteFunc(slices.Clone(f.pos.Holds), func(h xaHold) bool { return !prepared[h.XID] })
	if len(unknown) > 0 {
		f.d.cfg.Logger.Error("ferrymysql: XA transactions are prepared whose PREPARE the feed did not read (their binlog was purged, or the feed starts with a scan); "+
			"events they wrote are not delivered when they commit: if one wrote ferry_outbox, append its events again after it commits",
			"feed", f.name, "xa", unknown)
	}
}
