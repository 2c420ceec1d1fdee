package ferrymysql

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// The feed reads the binlog: the server writes a transaction there when it
// commits, whole, in commit order, so a transaction that took its ids
// early and committed late is read where it committed (never skipped),
// a transaction still open elsewhere writes nothing there (nothing waits
// for it), and a key's writers, which serialise on the key's row, are read
// in the order they committed.
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
// starts where the binlog stood when Migrate created the outbox. When the binlog a cursor
// needs was purged, or that position was never recorded, the feed scans
// the outbox table instead, in a consistent snapshot whose binlog position
// the server gives (START TRANSACTION WITH CONSISTENT SNAPSHOT), key by
// key in Seq order, and then follows the binlog from that position:
// nothing committed is missed, nothing read twice. A scan covers the rows
// appended since the last acknowledged event minus Config.RecoveryMargin
// (all of them for a feed that has none); an interrupted scan starts over.

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
	// At is the newest append time (µs) of an event delivered.
	At int64 `json:"at,omitempty"`
	// Scan is set while the feed scans the outbox (see above).
	Scan *scanState `json:"scan,omitempty"`
}

// scanState is a scan of the outbox: the rows of the partition appended
// at or after From (µs; 0: all).
type scanState struct {
	From int64 `json:"from"`
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
	return &feed{d: d, name: p.Feed, partition: p.Partition, pos: *c}, nil
}

// checkBinlog checks the server's binlog settings the feed needs.
func (d *Driver) checkBinlog(ctx context.Context) error {
	if d.dsn == nil {
		return fmt.Errorf("ferrymysql: open feed: %w: the feed reads the binlog over a replication connection of its own and needs the DSN: "+
			"set Config.DSN (ferrymysql.Open sets it; `ferry relay --database-url mysql://…` does)", ferrydriver.ErrMisconfigured)
	}
	var version string
	var logBin int
	var format, image, metadata string
	var serverID int64
	err := d.db.QueryRowContext(ctx, `SELECT @@version, @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, @@server_id`).
		Scan(&version, &logBin, &format, &image, &metadata, &serverID)
	if errNumber(err) == errUnknownSysVar {
		return fmt.Errorf("ferrymysql: open feed: %w: server %s has no binlog_row_metadata: the feed needs MariaDB 10.6 or later (%v)",
			ferrydriver.ErrMisconfigured, version, err)
	}
	if err != nil {
		return d.wrapErr("check the binlog settings", err)
	}
	if !strings.Contains(strings.ToLower(version), "mariadb") {
		return fmt.Errorf("ferrymysql: open feed: %w: server %s is MySQL; the feed supports MariaDB 10.6 and later (it reads the binlog position of a consistent snapshot, which MySQL does not give)",
			ferrydriver.ErrMisconfigured, version)
	}
	var problems []string
	if logBin != 1 {
		problems = append(problems, "log_bin is off: start the server with log-bin (log-bin = /var/lib/mysql/binlog in its configuration)")
	}
	if !strings.EqualFold(format, "ROW") {
		problems = append(problems, "binlog_format is "+format+": set binlog_format = ROW")
	}
	if !strings.EqualFold(image, "FULL") {
		problems = append(problems, "binlog_row_image is "+image+": set binlog_row_image = FULL")
	}
	if !strings.EqualFold(metadata, "FULL") {
		problems = append(problems, "binlog_row_metadata is "+metadata+": set binlog_row_metadata = FULL (the feed reads columns by name)")
	}
	if serverID == 0 {
		problems = append(problems, "server_id is 0: set server_id to a number unique among the servers of the replication topology")
	}
	if len(problems) > 0 {
		return fmt.Errorf("ferrymysql: open feed: %w: the server's binlog cannot be read by the feed: %s (in the [mariadb] section of the server's configuration, then restart it)",
			ferrydriver.ErrMisconfigured, strings.Join(problems, "; "))
	}
	return nil
}

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

	// The scan's snapshot, nil when not scanning (or before its first
	// read).
	snap *snapshot
}

// streamState is where the stream's reader stands.
type streamState struct {
	file string
	pos  uint32 // the start of the transaction being read, or of the next
	inTx bool
	// gtid is the GTID position at pos (nil: not known), and txGTID the
	// GTID of the transaction being read (nil between transactions).
	gtid   *gtidPos
	txGTID *gomysql.MariadbGTID
	txText string // txGTID's text
	// seen counts the partition's rows of the transaction at pos read so
	// far; skip is how many of them the cursor said were delivered, of
	// transaction skipTx (""; the first transaction read).
	seen, skip int
	skipTx     string
}

type pendingRow struct {
	ev       *ferryevent.Event
	invalid  string // set: the row is not a valid event
	file     string
	pos      uint32
	gtid     *string
	tx       string // the GTID of the row's transaction
	seen     int
	appended int64
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
	if isPurged(err) {
		from := int64(0)
		if f.pos.At > 0 {
			from = f.pos.At - f.d.cfg.RecoveryMargin.Microseconds()
		}
		f.d.cfg.Logger.Warn("ferrymysql: the binlog the feed needs was purged; it scans the outbox of its partition, then follows the binlog again",
			"feed", f.name, "file", f.pos.File, "pos", f.pos.Pos, "scan_from", fromMicros(from), "err", err)
		f.pos = cursor{V: 1, At: f.pos.At, Scan: &scanState{From: from}}
		return f.scan(ctx, limit)
	}
	return nil, err
}

// isPurged reports the server's refusal of a binlog position it no longer
// has (error 1236, whatever its text).
func isPurged(err error) bool {
	var me *gomysql.MyError
	return errors.As(err, &me) && me.Code == errMasterFatal
}

// follow reads the binlog. A read returns what was committed before it
// began (the binlog's end when it began: SHOW MASTER STATUS), however much
// of the binlog that takes reading (other databases' transactions move
// the position and deliver nothing), up to limit; and when that is
// nothing, what comes within wait.
func (f *feed) follow(ctx context.Context, limit int, wait time.Duration) (*ferrydriver.Batch, error) {
	if f.syncer == nil {
		if err := f.openStream(ctx); err != nil {
			return nil, err
		}
	}
	b := &ferrydriver.Batch{}
	cur := f.pos
	deadline := time.Now().Add(wait)
	var endFile string
	var endPos uint32
	for {
		for len(f.pending) > 0 && len(b.Events)+len(b.Invalid) < limit {
			r := f.pending[0]
			f.pending = f.pending[1:]
			if r.invalid != "" {
				b.Invalid = append(b.Invalid, &ferrydriver.InvalidRecord{Event: *r.ev, Reason: r.invalid})
			} else {
				b.Events = append(b.Events, r.ev)
			}
			cur.File, cur.Pos, cur.GTID, cur.Skip, cur.SkipTx, cur.At = r.file, r.pos, r.gtid, r.seen, r.tx, max(cur.At, r.appended)
		}
		if len(b.Events)+len(b.Invalid) >= limit {
			break
		}
		if !f.st.inTx {
			cur.File, cur.Pos, cur.GTID, cur.Skip, cur.SkipTx = f.st.file, f.st.pos, f.st.gtid.text(), 0, ""
		}
		var ev *replication.BinlogEvent
		var err error
		if f.st.inTx {
			// The rest of a transaction is already in the binlog.
			ev, err = f.next(ctx, -1)
		} else {
			if endFile == "" {
				if endFile, endPos, err = masterStatus(ctx, f.d.db); err != nil {
					return nil, f.d.wrapErr("read the binlog's end ("+f.name+")", err)
				}
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
		if err := f.handle(ev); err != nil {
			return nil, err
		}
	}
	f.pos = cur
	b.Cursor = cur.encode()
	return b, nil
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
	if isPurged(err) {
		return err
	}
	var me *gomysql.MyError
	if errors.As(err, &me) && me.Code == errAccessDenied {
		return fmt.Errorf("ferrymysql: read the binlog (%s): %w: user %s may not read it: GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO that user (%v)",
			f.name, ferrydriver.ErrMisconfigured, f.d.dsn.User, err)
	}
	return fmt.Errorf("ferrymysql: read the binlog (%s) at %s:%d: %w", f.name, f.st.file, f.st.pos, err)
}

// handle applies one binlog event to the stream's state and queues the
// partition's rows it carries.
func (f *feed) handle(ev *replication.BinlogEvent) error {
	switch e := ev.Event.(type) {
	case *replication.RotateEvent:
		if !f.st.inTx {
			f.st.file, f.st.pos = string(e.NextLogName), uint32(e.Position)
		}
	case *replication.MariadbGTIDEvent:
		// A transaction starts here (a stream started by GTID skips what
		// came before it, so the position so far may be older).
		if !f.st.inTx && ev.Header.LogPos >= ev.Header.EventSize && ev.Header.LogPos > 0 {
			f.st.pos = ev.Header.LogPos - ev.Header.EventSize
		}
		g := gtidOf(ev, e)
		f.st.txGTID, f.st.txText, f.st.inTx = &g, g.String(), true
	case *replication.GTIDEvent:
		f.st.inTx = true
	case *replication.QueryEvent:
		if strings.EqualFold(strings.TrimSpace(string(e.Query)), "BEGIN") {
			f.st.inTx = true
			break
		}
		// DDL, or the COMMIT of a non-transactional table's change: a
		// transaction boundary.
		f.boundary(ev.Header.LogPos)
	case *replication.XIDEvent:
		f.boundary(ev.Header.LogPos)
	case *replication.GenericEvent:
		// Heartbeats carry no position of their own to keep.
	default:
		// Between transactions, the events of the binlog itself (its
		// format description, GTID list, checkpoints) move the position.
		if !f.st.inTx && ev.Header.LogPos > 0 {
			f.st.pos = ev.Header.LogPos
		}
	case *replication.RowsEvent:
		switch ev.Header.EventType {
		case replication.WRITE_ROWS_EVENTv0, replication.WRITE_ROWS_EVENTv1, replication.WRITE_ROWS_EVENTv2, replication.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1:
		default:
			return nil
		}
		if e.Table == nil || string(e.Table.Schema) != f.d.schema || string(e.Table.Table) != "ferry_outbox" {
			return nil
		}
		cols, err := f.outboxColumns(e.Table)
		if err != nil {
			return err
		}
		for _, row := range e.Rows {
			if cols.int(row, cols.p) != int64(f.partition) {
				continue
			}
			f.st.seen++
			if f.st.seen <= f.st.skipping() {
				continue
			}
			ev, appended, invalid := cols.event(row)
			f.pending = append(f.pending, pendingRow{ev: ev, invalid: invalid, file: f.st.file, pos: f.st.pos, gtid: f.st.gtid.text(), tx: f.st.txText,
				seen: f.st.seen, appended: appended})
		}
	}
	return nil
}

// gtidOf is a GTID event's GTID, read from the event's bytes: a syncer
// started by GTID keeps a pointer to the GTID field of the first event of
// each domain and server in its own GTID set, and moves it forward as
// later events arrive, so the field may already hold a later
// transaction's GTID when the feed reads the event (go-mysql 1.13).
func gtidOf(ev *replication.BinlogEvent, e *replication.MariadbGTIDEvent) gomysql.MariadbGTID {
	const header = replication.EventHeaderSize
	if raw := ev.RawData; len(raw) >= header+12 {
		return gomysql.MariadbGTID{
			SequenceNumber: binary.LittleEndian.Uint64(raw[header:]),
			DomainID:       binary.LittleEndian.Uint32(raw[header+8:]),
			ServerID:       ev.Header.ServerID,
		}
	}
	return e.GTID
}

// skipping is how many of the partition's rows of the transaction being
// read were delivered before the stream started.
func (st *streamState) skipping() int {
	if st.skipTx == "" || st.skipTx == st.txText {
		return st.skip
	}
	return 0
}

// boundary ends the transaction being read: the next starts at end.
func (f *feed) boundary(end uint32) {
	if f.st.skipTx == "" || f.st.skipTx == f.st.txText {
		f.st.skip, f.st.skipTx = 0, ""
	}
	f.st.inTx, f.st.seen = false, 0
	if end > 0 {
		f.st.pos = end
	}
	if f.st.txGTID != nil {
		f.st.gtid = f.st.gtid.with(*f.st.txGTID)
		f.st.txGTID, f.st.txText = nil, ""
	}
}

// openStream starts reading the binlog at f.pos.
func (f *feed) openStream(ctx context.Context) error {
	d := f.d
	host, portText, err := net.SplitHostPort(d.dsn.Addr)
	if err != nil || (d.dsn.Net != "tcp" && d.dsn.Net != "") {
		return fmt.Errorf("ferrymysql: open feed %s: %w: the binlog is read over TCP, and Config.DSN's address %s (%s) is not host:port: give a tcp(host:port) address",
			f.name, ferrydriver.ErrMisconfigured, d.dsn.Addr, d.dsn.Net)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return fmt.Errorf("ferrymysql: open feed %s: %w: port %q of Config.DSN", f.name, ferrydriver.ErrMisconfigured, portText)
	}
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
	cfg := replication.BinlogSyncerConfig{
		ServerID:         d.cfg.ServerID + uint32(rand.IntN(1<<20)),
		Flavor:           gomysql.MariaDBFlavor,
		Host:             host,
		Port:             uint16(port),
		User:             d.dsn.User,
		Password:         d.dsn.Passwd,
		TLSConfig:        d.dsn.TLS,
		HeartbeatPeriod:  time.Second,
		ReadTimeout:      30 * time.Second,
		DisableRetrySync: true,
		DiscardGTIDSet:   true, // the feed keeps its own
		// Events read ahead of the relay: a bound on memory (a rows
		// event holds up to a few MiB of rows).
		EventCacheCount: 256,
		Logger:          slog.New(quietHandler{d.cfg.Logger.Handler()}).With("feed", f.name),
	}
	syncer := replication.NewBinlogSyncer(cfg)
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
	f.st = streamState{file: f.pos.File, pos: f.pos.Pos, skip: f.pos.Skip, gtid: gtid}
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
	f.syncer, f.events, f.errs, f.pending, f.columns = nil, nil, nil, nil, nil
}

// Close implements ferrydriver.Feed.
func (f *feed) Close() error {
	f.closeStream()
	f.endSnapshot()
	return nil
}

type tableMapKey struct {
	id      uint64
	columns uint64
}

// outboxColumns are the positions of ferry_outbox's columns in a table
// map's rows (read by name: binlog_row_metadata = FULL).
type outboxColumns struct {
	id, p, eventID, topic, k, seq, typ, source, contentType, headers, payload, createdAt, appendedAt int
}

func (f *feed) outboxColumns(t *replication.TableMapEvent) (*outboxColumns, error) {
	key := tableMapKey{id: t.TableID, columns: t.ColumnCount}
	if c, ok := f.columns[key]; ok {
		return c, nil
	}
	names := t.ColumnNameString()
	at := map[string]int{}
	for i, n := range names {
		at[n] = i
	}
	c := &outboxColumns{}
	for name, dst := range map[string]*int{"id": &c.id, "p": &c.p, "event_id": &c.eventID, "topic": &c.topic, "k": &c.k, "seq": &c.seq,
		"type": &c.typ, "source": &c.source, "content_type": &c.contentType, "headers": &c.headers, "payload": &c.payload,
		"created_at": &c.createdAt, "appended_at": &c.appendedAt} {
		i, ok := at[name]
		if !ok {
			return nil, fmt.Errorf("ferrymysql: read the binlog (%s): %w: the binlog's map of %s.ferry_outbox has no column %s (columns %v): binlog_row_metadata must be FULL, and the table Ferry's migrations made",
				f.name, ferrydriver.ErrMisconfigured, f.d.schema, name, names)
		}
		*dst = i
	}
	if f.columns == nil || len(f.columns) >= 64 {
		f.columns = map[tableMapKey]*outboxColumns{}
	}
	f.columns[key] = c
	return c, nil
}

// bytesOf copies a column's value (the row's strings share the event's
// buffer).
func bytesOf(v any) []byte {
	switch x := v.(type) {
	case string:
		return []byte(x)
	case []byte:
		return append([]byte(nil), x...)
	}
	return nil
}

func (c *outboxColumns) int(row []any, i int) int64 {
	switch x := row[i].(type) {
	case int64:
		return x
	case int32:
		return int64(x)
	case int16:
		return int64(x)
	case int8:
		return int64(x)
	case uint64:
		return int64(x)
	case uint32:
		return int64(x)
	}
	return -1
}

// event decodes an outbox row; invalid says why it is not a valid event.
func (c *outboxColumns) event(row []any) (ev *ferryevent.Event, appended int64, invalid string) {
	ev = &ferryevent.Event{Topic: string(bytesOf(row[c.topic])), Key: string(bytesOf(row[c.k])), Seq: c.int(row, c.seq),
		Type: string(bytesOf(row[c.typ])), Source: string(bytesOf(row[c.source])), ContentType: string(bytesOf(row[c.contentType])),
		Payload: bytesOf(row[c.payload]), CreatedAt: fromMicros(c.int(row, c.createdAt))}
	if ev.Payload == nil {
		ev.Payload = []byte{}
	}
	appended = c.int(row, c.appendedAt)
	// BINARY(16) is padded with zero bytes, which the binlog's row image
	// leaves out: a UUID that ends in zeros arrives shorter.
	raw := bytesOf(row[c.eventID])
	if len(raw) < 16 {
		raw = append(raw, make([]byte, 16-len(raw))...)
	}
	id, err := uuid.FromBytes(raw)
	if err != nil {
		return ev, appended, fmt.Sprintf("invalid outbox row %d: event_id: %v", c.int(row, c.id), err)
	}
	ev.ID = id
	if err := decodeHeaders(ev, bytesOf(row[c.headers])); err != nil {
		return ev, appended, "invalid outbox row: " + err.Error()
	}
	if err := ferryevent.CheckRelayable(ev); err != nil {
		return ev, appended, "invalid outbox row: " + err.Error()
	}
	return ev, appended, ""
}

// quietHandler passes go-mysql's log on with its INFO records (every
// binlog rotation, every connection's start and end) as DEBUG: the feed
// reports what matters to an operator itself.
type quietHandler struct{ slog.Handler }

func (h quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, quiet(l))
}

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = quiet(r.Level)
	return h.Handler.Handle(ctx, r)
}

func (h quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(as)}
}
func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name)}
}

func quiet(l slog.Level) slog.Level {
	if l <= slog.LevelInfo {
		return slog.LevelDebug
	}
	return l
}
