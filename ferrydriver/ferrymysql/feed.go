package ferrymysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
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

// streamState is where the stream's reader stands.
type streamState struct {
	file string
	pos  uint32 // the start of the group being read, or of the next
	// gtid is the GTID position at pos (nil: not known).
	gtid *gtidPos
	// holds are the XA transactions prepared before pos and not completed.
	holds []xaHold
	// g is the group being read; nil between groups.
	g *group
	// skip is how many of the partition's rows of group skipTx ("": the
	// first group read) the cursor said were delivered.
	skip   int
	skipTx string
}

// pendingRow is a row to deliver, and the cursor after it.
type pendingRow struct {
	outboxRow
	at cursor
	// visible: it was read from the table, not the binlog (its
	// transaction is visible).
	visible bool
}

// openSample is a start of the oldest open transaction (µs), and the
// binlog's end read after it: every transaction written after that end
// started after it.
type openSample struct {
	open int64
	file string
	pos  uint32
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

// binlogGone reports the server's refusal of a position it no longer has:
// its file was purged, or the GTID position is older than every binlog
// the server keeps (error 1236). A GTID position the server never had is
// another refusal (diverged).
func binlogGone(err error) bool {
	var me *gomysql.MyError
	if !errors.As(err, &me) || me.Code != errMasterFatal {
		return false
	}
	return strings.Contains(me.Message, "Could not find first log file name") ||
		strings.Contains(me.Message, "Could not find GTID state requested") ||
		strings.Contains(me.Message, "purged")
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

// awaitVisible returns once the transactions that wrote the rows ids (one
// row of each) are visible to a new read. The server writes a transaction
// to the binlog before InnoDB makes it visible, and InnoDB releases a
// committing transaction's locks a moment before a new read view sees it
// (under load, a shared lock alone let events through early).
// So a plain read decides: the rows it does not see yet are waited for
// with a shared lock (which returns once their transaction commits) and
// read again, a little later each time. A row the read never sees (its
// transaction deleted it again) stops the wait after visibleWait.
func (f *feed) awaitVisible(ctx context.Context, ids []int64) error {
	deadline := time.Now().Add(visibleWait)
	for pause := 100 * time.Microsecond; len(ids) > 0; pause = min(2*pause, 20*time.Millisecond) {
		unseen, err := f.invisible(ctx, ids)
		if err != nil || len(unseen) == 0 || time.Now().After(deadline) {
			return err
		}
		if err := f.lockWait(ctx, unseen); err != nil {
			return err
		}
		if len(unseen) < len(ids) || pause > 100*time.Microsecond {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pause):
			}
		}
		ids = unseen
	}
	return nil
}

// visibleWait bounds awaitVisible's wait for rows a plain read never sees.
const visibleWait = 2 * time.Second

// invisible returns the ids a new read does not see.
func (f *feed) invisible(ctx context.Context, ids []int64) ([]int64, error) {
	rows, err := f.d.db.QueryContext(ctx, `SELECT id FROM ferry_outbox WHERE id IN (?`+strings.Repeat(",?", len(ids)-1)+`)`, posArgs(ids)...)
	if err != nil {
		return nil, f.d.wrapErr("read the batch's rows ("+f.name+")", err)
	}
	defer rows.Close()
	seen := make(map[int64]bool, len(ids))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, f.d.wrapErr("read the batch's rows ("+f.name+")", err)
		}
		seen[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, f.d.wrapErr("read the batch's rows ("+f.name+")", err)
	}
	var unseen []int64
	for _, id := range ids {
		if !seen[id] {
			unseen = append(unseen, id)
		}
	}
	return unseen, nil
}

// lockWait returns once the transactions holding the rows ids have
// ended. Each lookup is of one key of the primary key, a SELECT of its own
// in one statement: it locks that row only (an IN list is read as a
// range, which also locks the gaps, and waits for an unrelated open
// transaction's row); the statement's locks end with it.
func (f *feed) lockWait(ctx context.Context, ids []int64) error {
	one := `(SELECT id FROM ferry_outbox WHERE id = ? LOCK IN SHARE MODE)`
	rows, err := f.d.db.QueryContext(ctx, one+strings.Repeat(" UNION ALL "+one, len(ids)-1), posArgs(ids)...)
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	return f.d.wrapErr("wait for the batch's transactions to be visible ("+f.name+")", err)
}

// posArgs are outbox row ids as statement arguments.
func posArgs(ids []int64) []any {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return args
}

// sampleOpen reads the start of the oldest open transaction (at most
// every openEvery), before the binlog's end is read (noteEnd).
func (f *feed) sampleOpen(ctx context.Context) {
	if f.noOpen || time.Since(f.sampled) < f.openEvery {
		return
	}
	f.sampled = time.Now()
	open, err := f.d.oldestOpen(ctx)
	if errNumber(err) == errAccessDenied {
		f.noOpen = true
		f.d.cfg.Logger.Warn("ferrymysql: the relay's user may not read INFORMATION_SCHEMA.INNODB_TRX (GRANT PROCESS ON *.* TO it): "+
			"a recovery from a purged binlog then starts Config.RecoveryMargin before the last event delivered, and misses a producer transaction open longer than that",
			"feed", f.name, "recovery_margin", f.d.cfg.RecoveryMargin, "err", err)
		return
	}
	if err != nil {
		f.d.cfg.Logger.Debug("ferrymysql: reading the oldest open transaction failed", "feed", f.name, "err", err)
		return
	}
	f.samples = append(f.samples, openSample{open: open})
}

// oldestOpen is a time (µs) before the append time of every outbox row
// of a transaction open now: the start of the oldest open transaction
// that has written rows, from a session in the driver's database, rounded
// down to the second (INFORMATION_SCHEMA.INNODB_TRX has whole seconds); a
// transaction that has written nothing yet appends later than now. The
// server fills INNODB_TRX from a cache up to 0.1 s old: innodbTrxAge
// covers a transaction that wrote since. A prepared XA transaction whose
// session ended has none and does not count (a forgotten one would hold
// every feed's retention back): the feed keeps its rows by id (xaHold).
func (d *Driver) oldestOpen(ctx context.Context) (int64, error) {
	var now int64
	var age sql.NullInt64
	err := d.db.QueryRowContext(ctx, `SELECT `+sqlNow+`, TIMESTAMPDIFF(MICROSECOND, MIN(t.trx_started), NOW(6))
  FROM information_schema.INNODB_TRX t JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
 WHERE t.trx_rows_modified > 0 AND p.DB = ?`, d.schema).Scan(&now, &age)
	return now - max(age.Int64, innodbTrxAge.Microseconds()), err
}

// innodbTrxAge bounds the age of INFORMATION_SCHEMA.INNODB_TRX's cache.
const innodbTrxAge = 200 * time.Millisecond

// noteEnd gives the sample just taken its binlog end.
func (f *feed) noteEnd(file string, pos uint32) {
	if n := len(f.samples); n > 0 && f.samples[n-1].file == "" {
		f.samples[n-1].file, f.samples[n-1].pos = file, pos
		if n > 16 {
			f.samples = f.samples[1:]
		}
	}
}

// passSamples sets c.Open from the samples c has passed.
func (f *feed) passSamples(c *cursor) {
	i := 0
	for ; i < len(f.samples) && f.samples[i].file != "" && atOrAfter(c.File, c.Pos, f.samples[i].file, f.samples[i].pos); i++ {
		c.Open = max(c.Open, f.samples[i].open)
	}
	f.samples = f.samples[i:]
}

// next returns the stream's next event: at once (wait 0), within wait, or
// whenever it comes (wait < 0); nil when none came.
func (f *feed) next(ctx context.Context, wait time.Duration) (*replication.BinlogEvent, error) {
	select {
	case ev := <-f.events:
		return ev, nil
	case err := <-f.errs:
		return nil, f.streamErr(err)
	default:
	}
	if wait == 0 {
		return nil, nil
	}
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case ev := <-f.events:
		return ev, nil
	case err := <-f.errs:
		return nil, f.streamErr(err)
	case <-timeout:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (f *feed) streamErr(err error) error {
	if binlogGone(err) {
		return err
	}
	var me *gomysql.MyError
	if errors.As(err, &me) && me.Code == errAccessDenied {
		return fmt.Errorf("ferrymysql: read the binlog (%s): %w: user %s may not read it: GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO that user (%v)",
			f.name, ferrydriver.ErrMisconfigured, f.d.dsn.User, err)
	}
	if errors.As(err, &me) && me.Code == errMasterFatal && strings.Contains(me.Message, "is not in the master's binlog") {
		return f.diverged(err)
	}
	return fmt.Errorf("ferrymysql: read the binlog (%s) at %s:%d: %w", f.name, f.st.file, f.st.pos, err)
}

// diverged is the error of a server whose binlog lacks the GTID position
// the feed resumes from.
func (f *feed) diverged(err error) error {
	rescan := cursor{V: 1, At: f.pos.At, Open: f.pos.Open, Holds: f.pos.Holds, Scan: &scanState{From: f.pos.scanFrom(f.d.cfg.RecoveryMargin)}}
	return fmt.Errorf("ferrymysql: read the binlog (%s): the server's binlog does not have the checkpoint's GTID position %s: this server has not applied "+
		"every transaction the feed already delivered (a failover to a replica that was behind or diverged), and the feed stops rather than skip or repeat events. "+
		"Point the relay at a server that has it (the former primary, or a replica that caught up); or, if those transactions are lost for good, "+
		"make the feed deliver what this server has by a scan of its outbox from the last delivered event: "+
		"UPDATE ferry_checkpoints SET pos = '%s' WHERE feed = '%s' (with the relays stopped): %w",
		f.name, deref(f.pos.GTID), rescan.encode(), f.name, err)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// openStream starts reading the binlog at f.pos.
func (f *feed) openStream(ctx context.Context) error {
	d := f.d
	// The GTID position to start from: the cursor's, or the server's
	// for the cursor's file and offset.
	start := f.pos.GTID
	byGTID := start != nil && *start != ""
	if start == nil {
		var g sql.NullString
		err := d.db.QueryRowContext(ctx, `SELECT BINLOG_GTID_POS(?, ?)`, f.pos.File, f.pos.Pos).Scan(&g)
		switch {
		case err != nil:
			// The feed still reads by file and offset; only its cursors
			// cannot follow a failover until a position is known.
			d.cfg.Logger.Warn("ferrymysql: the server did not translate the feed's binlog position into GTIDs; its checkpoints will hold none until it does",
				"feed", f.name, "file", f.pos.File, "pos", f.pos.Pos, "err", err)
		case g.Valid:
			start = &g.String
		}
		// NULL: the file is gone; StartSync below meets the purge.
	}
	var gtid *gtidPos
	if start != nil {
		p, err := parseGTIDPos(*start)
		if err != nil {
			return fmt.Errorf("ferrymysql: open feed %s: the checkpoint's GTID position %q: %w", f.name, *start, err)
		}
		gtid = &p
	}
	// Only the outbox's new rows are decoded: the server's other tables
	// are skipped unread.
	syncer, err := d.binlogSyncer("feed "+f.name, func(e *replication.RowsEvent) bool {
		return d.isOutbox(e) && e.Type() == replication.EnumRowsEventTypeInsert
	})
	if err != nil {
		return err
	}
	var streamer *replication.BinlogStreamer
	if byGTID {
		set, perr := gomysql.ParseMariadbGTIDSet(gtid.String())
		if perr != nil {
			syncer.Close()
			return fmt.Errorf("ferrymysql: open feed %s: GTID position %q: %w", f.name, gtid.String(), perr)
		}
		streamer, err = syncer.StartSyncGTID(set)
	} else {
		streamer, err = syncer.StartSync(gomysql.Position{Name: f.pos.File, Pos: f.pos.Pos})
	}
	if err != nil {
		syncer.Close()
		return fmt.Errorf("ferrymysql: read the binlog (%s) from %s:%d (GTID %s): %w", f.name, f.pos.File, f.pos.Pos, gtid.String(), err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	f.syncer, f.stop = syncer, cancel
	f.events, f.errs = make(chan *replication.BinlogEvent, 256), make(chan error, 1)
	f.st = streamState{file: f.pos.File, pos: f.pos.Pos, skip: f.pos.Skip, gtid: gtid, holds: f.pos.Holds}
	if byGTID {
		// By file and offset the transaction at the position comes first;
		// by GTID, the one the skip names (a cursor without SkipTx has no
		// skip, or was written by a stream that knew no GTIDs).
		f.st.skipTx = f.pos.SkipTx
	}
	f.pending = nil
	f.pumped.Add(1)
	go func() {
		defer f.pumped.Done()
		for {
			ev, err := streamer.GetEvent(pctx)
			if err != nil {
				if pctx.Err() == nil {
					f.errs <- err
				}
				return
			}
			select {
			case f.events <- ev:
			case <-pctx.Done():
				return
			}
		}
	}()
	return nil
}

func (f *feed) closeStream() {
	if f.syncer == nil {
		return
	}
	f.stop()
	f.syncer.Close()
	f.pumped.Wait()
	f.syncer, f.events, f.errs, f.pending, f.columns, f.samples = nil, nil, nil, nil, nil, nil
}

// Close implements ferrydriver.Feed.
func (f *feed) Close() error {
	f.closeStream()
	f.endSnapshot()
	return nil
}
