package ferrymysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// The feed reads the binlog: the server writes a transaction there when it
// commits, whole, in commit order, so a transaction that took its ids
// early and committed late is read where it committed (never skipped),
// a transaction still open elsewhere writes nothing there (nothing waits
// for it), and a key's writers, which serialise on the key's row, are read
// in the order they committed. What is in the binlog is not all committed,
// though (rolled-back savepoints, XA transactions, ROLLBACK groups): see
// group.go for what the feed delivers of a transaction, and when. A batch
// is returned only once its transactions are visible to a new read
// (awaitVisible): the server writes the binlog before InnoDB makes the
// commit visible.
//
// A cursor is a binlog position: the start of a transaction, and how many
// of the partition's rows of that transaction were delivered (a batch may
// end inside a large transaction). It also holds the server's GTID
// position there (the last transaction of each replication domain before
// it), and the feed resumes from that when it has it: a GTID names the
// same transaction on every server of the topology, where a file and an
// offset are one server's, so a relay follows a failover to a replica
// (which logs what it applies, log_slave_updates) without losing or
// repeating events. A position with no GTID (a feed's first, or a scan's)
// is translated by the server (BINLOG_GTID_POS). A feed with no cursor
// starts where the binlog stood when Migrate created the outbox.
//
// When the binlog a cursor needs was purged, or that position was never
// recorded, the feed scans the outbox table instead (scan.go), in a
// consistent snapshot whose binlog position the server gives, key by key
// in Seq order, and then follows the binlog from that position: nothing
// committed is missed, nothing read twice. A scan covers the rows appended
// since the start of the oldest transaction that was open when the feed
// read the cursor's position (cursor.Open), so a producer transaction that
// stayed open for hours is not missed; when that is not known (the relay's
// user may not read INFORMATION_SCHEMA.INNODB_TRX), since the last
// acknowledged event minus Config.RecoveryMargin.

// cursor is a feed's saved position.
type cursor struct {
	V int `json:"v"`
	// File and Pos are the binlog position where the next (or current)
	// transaction starts.
	File string `json:"file,omitempty"`
	Pos  uint32 `json:"pos,omitempty"`
	// GTID is the server's GTID position at File:Pos (gtid_binlog_pos's
	// form: "0-1-1234", one per domain); nil when not known.
	GTID *string `json:"gtid,omitempty"`
	// Skip counts the partition's rows of the transaction at Pos already
	// delivered, and SkipTx is that transaction's GTID: a stream started
	// by GTID may send other domains' transactions before it.
	Skip   int    `json:"skip,omitempty"`
	SkipTx string `json:"skip_tx,omitempty"`
	// Holds are the XA transactions prepared before Pos whose outcome the
	// feed has not read yet (group.go).
	Holds []xaHold `json:"xa,omitempty"`
	// At is the newest append time (µs) of an event delivered.
	At int64 `json:"at,omitempty"`
	// Open (µs) is a time before the start of every transaction written
	// to the binlog after Pos: a recovery scan from this cursor starts
	// there (minus Config.RecoveryMargin, for the server's clock). 0: not
	// known.
	Open int64 `json:"open,omitempty"`
	// Scan is set while the feed scans the outbox (see above).
	Scan *scanState `json:"scan,omitempty"`
}

// scanState is a scan of the outbox: the rows of the partition appended
// at or after From (µs; 0: all).
type scanState struct {
	From int64 `json:"from"`
}

// scanFrom is the oldest append time a recovery scan from c reads (µs;
// 0: every row): the margin before Open, or before the last event
// delivered when Open is not known.
func (c *cursor) scanFrom(margin time.Duration) int64 {
	switch {
	case c.Open > 0:
		return c.Open - margin.Microseconds()
	case c.At > 0:
		return c.At - margin.Microseconds()
	}
	return 0
}

func decodeCursor(b []byte) (*cursor, error) {
	c := &cursor{V: 1}
	if len(b) == 0 {
		return c, nil
	}
	if err := json.Unmarshal(b, c); err != nil || c.V != 1 {
		s := string(b)
		if len(s) > 80 {
			s = s[:80] + "…"
		}
		return nil, fmt.Errorf("ferrymysql: checkpoint cursor %q is not a ferrymysql cursor (was it written by another backend?): %v", s, err)
	}
	return c, nil
}

func (c *cursor) encode() []byte {
	b, _ := json.Marshal(c)
	return b
}

// OpenFeed implements ferrydriver.Store. It checks that the server writes
// a binlog the feed can read (ferrydriver.ErrMisconfigured names what to
// change otherwise).
func (d *Driver) OpenFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) (ferrydriver.Feed, error) {
	stored, err := d.StoredPartitions(ctx)
	if err != nil {
		return nil, err
	}
	if err := d.countStore().CheckFeed("open feed "+p.Feed, d.cfg.Partitions, stored, p.Partition); err != nil {
		return nil, err
	}
	if err := d.checkBinlog(ctx); err != nil {
		return nil, err
	}
	c, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, err
	}
	if len(p.Cursor) == 0 {
		// From the outbox's creation, or, when its binlog position is not
		// known, by a scan of the whole outbox.
		var file sql.NullString
		var pos sql.NullInt64
		if err := d.db.QueryRowContext(ctx, `SELECT binlog_file, binlog_pos FROM ferry_settings WHERE id = 1`).Scan(&file, &pos); err != nil {
			return nil, d.wrapErr("open feed "+p.Feed, err)
		}
		if file.Valid && file.String != "" {
			c.File, c.Pos = file.String, uint32(pos.Int64)
		} else {
			c.Scan = &scanState{}
		}
	}
	return d.newFeed(p.Feed, p.Partition, *c), nil
}

func (d *Driver) newFeed(name string, partition int, pos cursor) *feed {
	f := &feed{d: d, name: name, partition: partition, pos: pos, holdRows: holdRows, readEvents: readEvents, openEvery: openEvery}
	if l := d.feedLimits; l != nil {
		f.holdRows, f.readEvents, f.openEvery = l.holdRows, l.readEvents, l.openEvery
	}
	return f
}

// feedLimits replace a feed's bounds in tests.
type feedLimits struct {
	holdRows, readEvents int
	openEvery            time.Duration
}

// The bounds of one Read: it returns when it has read readEvents binlog
// events or for readTime, whatever it found (its cursor moved past what it
// read), so that a feed catching up through other tables' transactions
// saves its progress as it goes.
const (
	readEvents = 100_000
	readTime   = time.Second
	// openEvery is how often a feed reads the start of the oldest open
	// transaction (cursor.Open).
	openEvery = time.Second
)

type feed struct {
	d         *Driver
	name      string
	partition int
	// pos is the position after the last batch returned.
	pos cursor

	// The binlog stream, nil until the first read (and after an error).
	syncer *replication.BinlogSyncer
	events chan *replication.BinlogEvent
	errs   chan error
	stop   context.CancelFunc
	pumped sync.WaitGroup
	st     streamState
	// pending are rows read from the stream and not yet returned.
	pending []pendingRow
	// columns caches the outbox's column positions per table id (and
	// column count: an ALTER gives the table a new map). go-mysql decodes
	// a new table map for every transaction, so its pointer is no key.
	columns map[tableMapKey]*outboxColumns
	// known is a group too large to hold whose end was read (group.go),
	// and reread says that the stream must start again before it.
	known  *knownGroup
	reread bool
	// samples are starts of the oldest open transaction, each with the
	// binlog's end read after it, not yet passed by the cursor; sampled
	// is when the last was taken, and noOpen that they cannot be read.
	samples []openSample
	sampled time.Time
	noOpen  bool
	// foreignRows counts other tables' rows events that arrived decoded.
	foreignRows int

	// Test knobs: the group size held in memory, the bounds of a Read,
	// how often cursor.Open is read.
	holdRows   int
	readEvents int
	openEvery  time.Duration

	// The scan's snapshot, nil when not scanning (or before its first
	// read).
	snap *snapshot
}

// pendingRow is a row to deliver, and the cursor after it.
type pendingRow struct {
	outboxRow
	at cursor
	// visible: it was read from the table, not the binlog (its
	// transaction is visible).
	visible bool
}

// Read implements ferrydriver.Feed.
func (f *feed) Read(ctx context.Context, p *ferrydriver.ReadParams) (*ferrydriver.Batch, error) {
	limit := max(p.Max, 1)
	if f.pos.Scan != nil {
		return f.scan(ctx, limit)
	}
	b, err := f.follow(ctx, limit, p.Wait)
	if err == nil {
		return b, nil
	}
	f.closeStream()
	var sw *statementWriteError
	switch {
	case binlogGone(err):
		f.d.cfg.Logger.Warn("ferrymysql: the binlog the feed needs was purged; it scans the outbox of its partition, then follows the binlog again",
			"feed", f.name, "file", f.pos.File, "pos", f.pos.Pos, "scan_from", fromMicros(f.pos.scanFrom(f.d.cfg.RecoveryMargin)), "err", err)
	case errors.As(err, &sw):
		f.d.cfg.Logger.Error("ferrymysql: "+sw.Error()+"; the feed scans the outbox of its partition to deliver its events, then follows the binlog again",
			"feed", f.name, "file", f.pos.File, "pos", f.pos.Pos, "scan_from", fromMicros(f.pos.scanFrom(f.d.cfg.RecoveryMargin)))
	default:
		return nil, err
	}
	f.pos = cursor{V: 1, At: f.pos.At, Open: f.pos.Open, Holds: f.pos.Holds, Scan: &scanState{From: f.pos.scanFrom(f.d.cfg.RecoveryMargin)}}
	return f.scan(ctx, limit)
}

// follow reads the binlog. A read returns what was committed before it
// began (the binlog's end when it began: SHOW MASTER STATUS), however much
// of the binlog that takes reading (other databases' transactions move
// the position and deliver nothing) within its bounds (readEvents,
// readTime), up to limit; and when that is nothing, what comes within
// wait.
func (f *feed) follow(ctx context.Context, limit int, wait time.Duration) (*ferrydriver.Batch, error) {
	if f.syncer == nil {
		if err := f.openStream(ctx); err != nil {
			return nil, err
		}
	}
	b := &ferrydriver.Batch{}
	cur := f.pos
	start := time.Now()
	deadline := start.Add(wait)
	var endFile string
	var endPos uint32
	// A row of each transaction the batch delivers from the binlog (its
	// last): the batch is returned once they are visible.
	var unseen []int64
	lastTx := ""
	read := 0
	for {
		for len(f.pending) > 0 && len(b.Events)+len(b.Invalid) < limit {
			r := f.pending[0]
			f.pending = f.pending[1:]
			if r.invalid != "" {
				b.Invalid = append(b.Invalid, &ferrydriver.InvalidRecord{Event: *r.ev, Reason: r.invalid})
			} else {
				b.Events = append(b.Events, r.ev)
			}
			if !r.visible {
				if len(unseen) > 0 && r.at.SkipTx == lastTx {
					unseen[len(unseen)-1] = r.id
				} else {
					unseen = append(unseen, r.id)
				}
				lastTx = r.at.SkipTx
			}
			at, open := max(cur.At, r.appended), cur.Open
			cur = r.at
			cur.At, cur.Open = at, open
		}
		if len(b.Events)+len(b.Invalid) >= limit {
			break
		}
		g := f.st.g
		if g == nil {
			if f.st.skip == 0 {
				// Between groups (past the one the cursor skips into).
				cur.File, cur.Pos, cur.GTID, cur.Skip, cur.SkipTx, cur.Holds = f.st.file, f.st.pos, f.st.gtid.text(), 0, "", f.st.holds
			}
			if read >= f.readEvents || time.Since(start) >= readTime {
				break
			}
		} else if g.release != nil {
			if err := f.releasePage(ctx); err != nil {
				return nil, err
			}
			continue
		}
		var ev *replication.BinlogEvent
		var err error
		if g != nil {
			// The rest of a transaction is already in the binlog.
			ev, err = f.next(ctx, -1)
		} else {
			if endFile == "" {
				f.sampleOpen(ctx)
				if endFile, endPos, err = masterStatus(ctx, f.d.db); err != nil {
					return nil, f.d.wrapErr("read the binlog's end ("+f.name+")", err)
				}
				f.noteEnd(endFile, endPos)
			}
			switch {
			case !atOrAfter(f.st.file, f.st.pos, endFile, endPos):
				ev, err = f.next(ctx, -1) // behind: the events are on their way
			case len(b.Events)+len(b.Invalid) > 0:
				ev, err = f.next(ctx, 0) // only what has arrived
			default:
				ev, err = f.next(ctx, max(time.Until(deadline), 0))
			}
		}
		if err != nil {
			return nil, err
		}
		if ev == nil {
			break
		}
		read++
		if err := f.handle(ev); err != nil {
			return nil, err
		}
		if f.reread {
			// A group too large to hold was read to its end: the stream
			// starts again before it (cur is there), and delivers it.
			f.reread = false
			f.d.rereads.Add(1)
			f.closeStream()
			break
		}
	}
	if err := f.awaitVisible(ctx, unseen); err != nil {
		return nil, err
	}
	f.passSamples(&cur)
	f.pos = cur
	b.Cursor = cur.encode()
	return b, nil
}

// Close implements ferrydriver.Feed.
func (f *feed) Close() error {
	f.closeStream()
	f.endSnapshot()
	return nil
}
