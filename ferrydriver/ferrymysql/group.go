package ferrymysql

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// How the feed reads transactions out of the binlog.
//
// MariaDB writes a transaction to the binlog when it commits, as an event
// group: a GTID event, the transaction's events, and an end (an XID event,
// COMMIT or ROLLBACK). Not every group is a committed transaction, and not
// every row in one was committed:
//
//   - A group can end with ROLLBACK. A transaction that changed a table
//     that cannot roll back (MyISAM, a temporary table) is written even
//     when it rolls back, InnoDB rows included, and so is the part of such
//     a transaction before a ROLLBACK TO a savepoint it took before its
//     first change.
//   - SAVEPOINT and ROLLBACK TO are written inside the group when the
//     transaction changed such a table (InnoDB-only transactions drop the
//     rolled-back rows instead). The rows between a SAVEPOINT and a
//     ROLLBACK TO it were rolled back; a later SAVEPOINT of the same name
//     replaces the earlier one; a savepoint taken before the group's first
//     row is not written, and a ROLLBACK TO it undoes the whole group so
//     far.
//   - An XA transaction is written at XA PREPARE, in a group of its own
//     that ends with an XA_PREPARE event, and becomes visible only at XA
//     COMMIT, written later in a group of its own (or never, after XA
//     ROLLBACK).
//
// So the feed holds a group's rows of its partition until it reads the
// group's end, drops the rows rolled back to a savepoint, and delivers the
// rest only when the end is a commit. The rows of an XA transaction are
// delivered at its XA COMMIT, where it commits: at its PREPARE the feed
// keeps the ids of its rows (in the cursor too, xaHold, so a relay started
// in between still knows them), and at its COMMIT reads them back from the
// outbox table, with a shared lock that waits for the commit to be
// visible.
//
// A group holds at most holdRows rows (or holdBytes of payloads) in
// memory. A larger one is read to its end keeping only which of its rows
// were rolled back (knownGroup), and then read again from its start,
// its rows delivered as they come.

const (
	// holdRows and holdBytes bound the rows of one group held in memory.
	holdRows  = 10_000
	holdBytes = 64 << 20
)

// The flags of MariaDB's GTID event (Gtid_log_event::flags2).
const (
	flStandalone    = replication.BINLOG_MARIADB_FL_STANDALONE // one statement, no end event
	flGroupCommitID = replication.BINLOG_MARIADB_FL_GROUP_COMMIT_ID
	flPreparedXA    = 64  // an XA transaction's PREPARE
	flCompletedXA   = 128 // an XA transaction's COMMIT or ROLLBACK
)

// group is the event group being read.
type group struct {
	text       string // its GTID ("" for a group without a GTID event)
	gtid       gomysql.MariadbGTID
	hasGTID    bool
	standalone bool
	// xid is an XA transaction's XID, in its PREPARE group (prepare) and
	// in the group that completes it.
	xid     string
	prepare bool
	// seen counts the partition's rows read so far, rolled back or not.
	seen int
	// rows are the rows held until the end, bytes their payloads' size;
	// overflow: there were too many to hold.
	rows     []pendingRow
	bytes    int
	overflow bool
	// ids are an XA PREPARE group's rows.
	ids     []heldID
	marks   []savepoint
	dropped []span // rolled back to a savepoint, by seen
	// known: a second reading of a group whose end was read, its rows
	// delivered as they come (f.known has what was rolled back).
	known bool
	// release is an XA COMMIT's rows still to read back, and end where
	// the group ends.
	release *release
	end     uint32
}

type savepoint struct {
	name string
	seen int // the rows before it
}

// span is a range of seen numbers, both ends included.
type span struct{ from, to int }

type heldID struct {
	seen int
	id   int64
}

// knownGroup is a group too large to hold, read to its end: its GTID, and
// which of its rows were rolled back.
type knownGroup struct {
	tx      string
	dropped []span
}

// xaHold is an XA transaction prepared before a cursor's position and not
// yet committed or rolled back, with the ids of the partition's outbox
// rows it wrote (ranges, both ends included), in the order it wrote them.
type xaHold struct {
	XID string     `json:"xid"`
	IDs [][2]int64 `json:"ids"`
}

// release reads an XA transaction's rows back, a page at a time.
type release struct {
	left   [][2]int64 // the ranges not read yet
	before int        // how many ids come before left[0]
}

type outcome int

const (
	committed outcome = iota
	rolledBack
	prepared
)

// handle applies one binlog event to the stream's state and queues the
// partition's rows it makes deliverable.
func (f *feed) handle(ev *replication.BinlogEvent) error {
	st := &f.st
	switch e := ev.Event.(type) {
	case *replication.RotateEvent:
		if st.g == nil {
			st.file, st.pos = string(e.NextLogName), uint32(e.Position)
		}
	case *replication.MariadbGTIDEvent:
		f.startGroup(ev)
	case *replication.QueryEvent:
		return f.query(ev.Header.LogPos, e)
	case *replication.XIDEvent:
		f.end(ev.Header.LogPos, committed)
	case *replication.GenericEvent:
		// Heartbeats carry no position of their own to keep.
		if ev.Header.EventType == replication.XA_PREPARE_LOG_EVENT && st.g != nil {
			f.end(ev.Header.LogPos, prepared)
		}
	case *replication.RowsEvent:
		return f.rows(ev, e)
	default:
		// Between groups, the events of the binlog itself (its format
		// description, GTID list, checkpoints) move the position.
		if st.g == nil && ev.Header.LogPos > 0 {
			st.pos = ev.Header.LogPos
		}
	}
	return nil
}

// startGroup begins the group of a GTID event.
func (f *feed) startGroup(ev *replication.BinlogEvent) {
	st := &f.st
	if st.g != nil {
		// The group before had no end: the server stopped while writing
		// it, and it never committed.
		f.d.cfg.Logger.Warn("ferrymysql: a binlog event group ends without a commit; its events are not delivered",
			"feed", f.name, "gtid", st.g.text, "file", st.file, "pos", st.pos)
		st.g = nil
	}
	// A group starts here (a stream started by GTID skips what came before
	// it, so the position so far may be older).
	if ev.Header.LogPos >= ev.Header.EventSize && ev.Header.LogPos > 0 {
		st.pos = ev.Header.LogPos - ev.Header.EventSize
	}
	g := readGTIDEvent(ev)
	g.known = f.known != nil && f.known.tx == g.text
	st.g = g
}

// readGTIDEvent reads a GTID event's bytes: a syncer started by GTID keeps
// a pointer to the GTID field of the first event of each domain and server
// in its own GTID set, and moves it forward as later events arrive, so
// the decoded field may already hold a later transaction's GTID when the
// feed reads the event (go-mysql 1.13).
func readGTIDEvent(ev *replication.BinlogEvent) *group {
	b := ev.RawData
	if len(b) >= replication.EventHeaderSize {
		b = b[replication.EventHeaderSize:]
	}
	g := &group{hasGTID: true}
	if len(b) < 13 {
		if e, ok := ev.Event.(*replication.MariadbGTIDEvent); ok {
			g.gtid = e.GTID
		}
		g.text = g.gtid.String()
		return g
	}
	g.gtid = gomysql.MariadbGTID{SequenceNumber: binary.LittleEndian.Uint64(b), DomainID: binary.LittleEndian.Uint32(b[8:]), ServerID: ev.Header.ServerID}
	g.text = g.gtid.String()
	flags := b[12]
	g.standalone = flags&flStandalone != 0
	g.prepare = flags&flPreparedXA != 0
	b = b[13:]
	if flags&flGroupCommitID != 0 && len(b) >= 8 {
		b = b[8:]
	}
	if flags&(flPreparedXA|flCompletedXA) != 0 && len(b) >= 6 {
		format := int32(binary.LittleEndian.Uint32(b))
		gl, bl := int(b[4]), int(b[5])
		if len(b) >= 6+gl+bl {
			g.xid = xaID(int64(format), b[6:6+gl], b[6+gl:6+gl+bl])
		}
	}
	return g
}

// xaID is an XID's form in the feed's cursors.
func xaID(format int64, gtrid, bqual []byte) string {
	return fmt.Sprintf("%d:%x:%x", format, gtrid, bqual)
}

// query handles a statement event: a group's start or end, a savepoint,
// or a statement inside a group.
func (f *feed) query(end uint32, e *replication.QueryEvent) error {
	q := strings.TrimSpace(string(e.Query))
	st := &f.st
	g := st.g
	if g == nil {
		if strings.EqualFold(q, "BEGIN") {
			st.g = &group{}
		} else {
			f.boundary(end) // a statement of its own, from a server that writes no GTID event
		}
		return nil
	}
	switch {
	case strings.EqualFold(q, "BEGIN"), hasPrefixFold(q, "XA START"), hasPrefixFold(q, "XA END"):
	case strings.EqualFold(q, "COMMIT"):
		f.end(end, committed)
	case strings.EqualFold(q, "ROLLBACK"):
		f.end(end, rolledBack)
	case hasPrefixFold(q, "SAVEPOINT "):
		g.savepoint(savepointName(q[len("SAVEPOINT "):]))
	case hasPrefixFold(q, "ROLLBACK TO "):
		g.rollbackTo(savepointName(q[len("ROLLBACK TO "):]))
	case g.xid != "" && hasPrefixFold(q, "XA ROLLBACK"):
		f.end(end, rolledBack)
	case g.xid != "" && !g.prepare && hasPrefixFold(q, "XA COMMIT"):
		f.commitXA(end)
	case g.standalone:
		f.end(end, committed)
	case f.d.writesOutbox(e, q):
		// A session that set binlog_format = STATEMENT (or MIXED) wrote the
		// outbox: its rows are not in the binlog, only the statement.
		return &statementWriteError{gtid: g.text, query: q}
	}
	return nil
}

// writesOutbox reports a statement inside a transaction that may have
// written the driver's outbox: it names ferry_outbox, and ran in the
// driver's database or names it.
func (d *Driver) writesOutbox(e *replication.QueryEvent, q string) bool {
	lq := strings.ToLower(q)
	return strings.Contains(lq, "ferry_outbox") && (string(e.Schema) == d.schema || strings.Contains(lq, strings.ToLower(d.schema)))
}

// statementWriteError is a group that wrote the outbox as a statement.
type statementWriteError struct{ gtid, query string }

func (e *statementWriteError) Error() string {
	q := e.query
	if len(q) > 200 {
		q = q[:200] + "…"
	}
	return fmt.Sprintf("transaction %s wrote ferry_outbox as a statement (%q), not as rows: the session that ran it used binlog_format = STATEMENT or MIXED; "+
		"keep binlog_format = ROW in every session that appends events", e.gtid, q)
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// savepointName is the name in "`name`" or "SAVEPOINT `name`".
func savepointName(s string) string {
	s = strings.TrimSpace(s)
	if hasPrefixFold(s, "SAVEPOINT ") {
		s = strings.TrimSpace(s[len("SAVEPOINT "):])
	}
	if len(s) >= 2 && s[0] == '`' && s[len(s)-1] == '`' {
		s = strings.ReplaceAll(s[1:len(s)-1], "``", "`")
	}
	return s
}

// savepoint marks a savepoint (replacing one of the same name: savepoint
// names are not case-sensitive).
func (g *group) savepoint(name string) {
	g.marks = slices.DeleteFunc(g.marks, func(m savepoint) bool { return strings.EqualFold(m.name, name) })
	g.marks = append(g.marks, savepoint{name: name, seen: g.seen})
}

// rollbackTo drops the rows after savepoint name, and the savepoints
// after it.
func (g *group) rollbackTo(name string) {
	at := 0 // a savepoint that is not in the group was taken before its first row
	if i := slices.IndexFunc(g.marks, func(m savepoint) bool { return strings.EqualFold(m.name, name) }); i >= 0 {
		at = g.marks[i].seen
		g.marks = g.marks[:i+1]
	} else {
		g.marks = g.marks[:0]
	}
	if g.seen <= at {
		return
	}
	g.dropped = append(g.dropped, span{from: at + 1, to: g.seen})
	if i := slices.IndexFunc(g.rows, func(r pendingRow) bool { return r.at.Skip > at }); i >= 0 {
		for _, r := range g.rows[i:] {
			g.bytes -= len(r.ev.Payload)
		}
		g.rows = g.rows[:i]
	}
	if i := slices.IndexFunc(g.ids, func(h heldID) bool { return h.seen > at }); i >= 0 {
		g.ids = g.ids[:i]
	}
}

func dropped(spans []span, seen int) bool {
	return slices.ContainsFunc(spans, func(s span) bool { return seen >= s.from && seen <= s.to })
}

// rows takes the partition's rows of an outbox write.
func (f *feed) rows(ev *replication.BinlogEvent, e *replication.RowsEvent) error {
	switch ev.Header.EventType {
	case replication.WRITE_ROWS_EVENTv0, replication.WRITE_ROWS_EVENTv1, replication.WRITE_ROWS_EVENTv2, replication.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1:
	default:
		return nil
	}
	if !f.d.isOutbox(e) {
		if len(e.Rows) > 0 {
			f.foreignRows++ // decoded for nothing: binlogSyncer's filter failed
		}
		return nil
	}
	cols, err := f.outboxColumns(e.Table)
	if err != nil {
		return err
	}
	g := f.st.g
	if g == nil { // rows outside a group: a group of their own, ended by the next end
		g = &group{}
		f.st.g = g
	}
	for _, row := range e.Rows {
		if cols.int(row, cols.p) != int64(f.partition) {
			continue
		}
		g.seen++
		if g.seen <= f.st.skipping() {
			continue
		}
		switch {
		case g.prepare:
			g.ids = append(g.ids, heldID{seen: g.seen, id: cols.int(row, cols.id)})
		case g.known:
			if !dropped(f.known.dropped, g.seen) {
				f.pending = append(f.pending, f.pendingAt(cols.row(row)))
			}
		case g.overflow:
		default:
			r := cols.row(row)
			g.rows = append(g.rows, f.pendingAt(r))
			g.bytes += len(r.ev.Payload)
			if g.hasGTID && (len(g.rows) > f.holdRows || g.bytes > holdBytes) { // read again by its GTID
				g.overflow, g.rows, g.bytes = true, nil, 0
			}
		}
	}
	return nil
}

// isOutbox reports a rows event of the driver's ferry_outbox.
func (d *Driver) isOutbox(e *replication.RowsEvent) bool {
	return e.Table != nil && string(e.Table.Table) == "ferry_outbox" && string(e.Table.Schema) == d.schema
}

// pendingAt is r as the group's row number seen: where a cursor after it
// stands.
func (f *feed) pendingAt(r outboxRow) pendingRow {
	st := &f.st
	return pendingRow{outboxRow: r, at: cursor{V: 1, File: st.file, Pos: st.pos, GTID: st.gtid.text(),
		Skip: st.g.seen, SkipTx: st.g.text, Holds: st.holds}}
}

// end ends the group being read at o, and the next group starts at next.
func (f *feed) end(next uint32, o outcome) {
	st := &f.st
	if g := st.g; g != nil && o != rolledBack {
		switch {
		case g.prepare:
			if o == prepared && len(g.ids) > 0 {
				st.holds = append(slices.Clip(st.holds), xaHold{XID: g.xid, IDs: idRanges(g.ids)})
			}
		case g.known:
			f.known = nil
		case g.overflow:
			f.known = &knownGroup{tx: g.text, dropped: g.dropped}
			f.reread = true
		default:
			f.pending = append(f.pending, g.rows...)
		}
	}
	f.boundary(next)
}

// boundary closes the group being read: the next starts at next.
func (f *feed) boundary(next uint32) {
	st := &f.st
	g := st.g
	if g == nil {
		g = &group{}
	}
	if st.skipTx == "" || st.skipTx == g.text {
		st.skip, st.skipTx = 0, ""
	}
	if g.hasGTID {
		st.gtid = st.gtid.with(g.gtid)
	}
	if g.xid != "" && !g.prepare {
		st.holds = slices.DeleteFunc(slices.Clone(st.holds), func(h xaHold) bool { return h.XID == g.xid })
	}
	st.g = nil
	if next > 0 {
		st.pos = next
	}
}

// skipping is how many of the partition's rows of the group being read
// were delivered before the stream started.
func (st *streamState) skipping() int {
	if st.skipTx == "" || (st.g != nil && st.skipTx == st.g.text) {
		return st.skip
	}
	return 0
}

// idRanges packs ids, in order, into ranges of consecutive ids.
func idRanges(ids []heldID) [][2]int64 {
	var out [][2]int64
	for _, h := range ids {
		if n := len(out); n > 0 && out[n-1][1]+1 == h.id {
			out[n-1][1] = h.id
			continue
		}
		out = append(out, [2]int64{h.id, h.id})
	}
	return out
}

// commitXA starts delivering the rows of the XA transaction the group
// commits, if it has any in the partition; follow reads them a page at a
// time (releasePage).
func (f *feed) commitXA(end uint32) {
	g := f.st.g
	i := slices.IndexFunc(f.st.holds, func(h xaHold) bool { return h.XID == g.xid })
	if i < 0 {
		f.end(end, committed)
		return
	}
	g.release = &release{left: slices.Clone(f.st.holds[i].IDs)}
	g.end = end
}

// releasePage reads the next page of an XA COMMIT's rows back from the
// outbox, with a shared lock: it waits for the commit to be visible. A
// row's number in the group is its place among the transaction's ids (a
// row removed since is skipped without moving the others).
func (f *feed) releasePage(ctx context.Context) error {
	g := f.st.g
	rel := g.release
	var where []string
	var args []any
	var taken [][2]int64
	n := int64(0)
	for len(rel.left) > 0 && n < int64(f.holdRows) {
		r := rel.left[0]
		hi := min(r[1], r[0]+int64(f.holdRows)-n-1)
		where = append(where, "id BETWEEN ? AND ?")
		args = append(args, r[0], hi)
		taken = append(taken, [2]int64{r[0], hi})
		n += hi - r[0] + 1
		if hi == r[1] {
			rel.left = rel.left[1:]
		} else {
			rel.left[0][0] = hi + 1
		}
	}
	rows, err := f.d.db.QueryContext(ctx, `SELECT `+outboxSelect+` FROM ferry_outbox WHERE `+strings.Join(where, " OR ")+` ORDER BY id LOCK IN SHARE MODE`, args...)
	if err != nil {
		return f.d.wrapErr("read the rows of XA transaction "+g.xid+" ("+f.name+")", err)
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return f.d.wrapErr("read the rows of XA transaction "+g.xid+" ("+f.name+")", err)
		}
		before := rel.before
		for _, t := range taken {
			if r.id <= t[1] {
				g.seen = before + int(r.id-t[0]) + 1
				break
			}
			before += int(t[1] - t[0] + 1)
		}
		if g.seen <= f.st.skipping() {
			continue
		}
		p := f.pendingAt(r)
		p.visible = true
		f.pending = append(f.pending, p)
	}
	if err := rows.Err(); err != nil {
		return f.d.wrapErr("read the rows of XA transaction "+g.xid+" ("+f.name+")", err)
	}
	rel.before += int(n)
	if len(rel.left) == 0 {
		g.release = nil
		f.end(g.end, committed)
	}
	return nil
}
