package ferrymysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// The feed's binlog stream: opening it at the cursor's position (by GTID
// when the server has them), reading its events, and telling an outage
// from a binlog that is gone or a server that diverged.

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

// noteEnd gives the sample just taken its binlog end.
func (f *feed) noteEnd(file string, pos uint32) {
	if n := len(f.samples); n > 0 && f.samples[n-1].file == "" {
		f.samples[n-1].file, f.samples[n-1].pos = file, pos
		if n > 16 {
			f.samples = f.samples[1:]
		}
	}
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
