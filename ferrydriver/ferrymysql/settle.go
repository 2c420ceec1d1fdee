package ferrymysql

import (
	"context"
	"fmt"
	"sync"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// Settlement (AwaitSettled) reads on the pool's connections, each read an
// autocommit statement that sees what committed before it began: never a
// caller's snapshot, whatever transaction the caller has open (a
// REPEATABLE READ snapshot taken before the consumer's commit still gets
// "settled").
//
// It is woken by the binlog. One reader per driver (a replication
// connection, as Config.DSN's user) starts with the first waiter, at the
// binlog's end, and stops settleLinger after the last one. It follows the
// row changes of ferry_inbox in the driver's database: a row of a waited
// group and event whose new image is finished (processed, dead,
// discarded, retracted) wakes that event's waiters, who read it again.
// The server writes a transaction to the binlog before InnoDB makes it
// visible, so a waiter that does not see yet what the binlog said reads
// again a moment later. A waiter reads its pending events again every
// settleSafetyNet too: a safety net for a reader that broke (it is
// restarted, and every waiter reads again) or that cannot run (no DSN, no
// binlog, no replication grant: a warning says so), not the mechanism.

const (
	// settleLinger is how long the binlog reader outlives its last waiter.
	settleLinger = 5 * time.Second
	// settleSafetyNet is how often a waiter reads its events again when
	// nothing woke it.
	settleSafetyNet = 2 * time.Second
	// settleRestart is how soon a reader that broke is started again
	// while waiters remain.
	settleRestart = time.Second
	// settleRetryStart is how soon a reader that could not start is tried
	// again (by the next waiter).
	settleRetryStart = 10 * time.Second
)

// settleHub is the driver's binlog reader and its waiters.
type settleHub struct {
	startMu sync.Mutex // held while a reader starts: waiters read after it

	mu      sync.Mutex // guards what follows
	subs    map[string]map[uuid.UUID]map[*settleSub]struct{}
	waiters int
	r       *settleReader
	linger  *time.Timer
	retryAt time.Time // no start before (the last one failed)
	warned  bool
	closed  bool
	// notes counts the waiters woken by the binlog, and listening the
	// waiters past their first read (for tests).
	notes     int64
	listening int
}

// settleSub is one AwaitSettled call's subscription.
type settleSub struct {
	notes chan uuid.UUID // an event the binlog says finished
	dirty chan struct{}  // a note did not fit, or the reader restarted: read everything again
}

type settleReader struct {
	syncer *replication.BinlogSyncer
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *settleReader) stop() {
	r.cancel()
	r.syncer.Close()
	<-r.done
}

// subscribe registers a waiter for ids of group and makes sure a reader
// runs (or has just failed to start): what commits after subscribe
// returns wakes the waiter.
func (h *settleHub) subscribe(ctx context.Context, d *Driver, group string, ids []uuid.UUID) (*settleSub, func()) {
	s := &settleSub{notes: make(chan uuid.UUID, len(ids)), dirty: make(chan struct{}, 1)}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[string]map[uuid.UUID]map[*settleSub]struct{}{}
	}
	g := h.subs[group]
	if g == nil {
		g = map[uuid.UUID]map[*settleSub]struct{}{}
		h.subs[group] = g
	}
	for _, id := range ids {
		m := g[id]
		if m == nil {
			m = map[*settleSub]struct{}{}
			g[id] = m
		}
		m[s] = struct{}{}
	}
	h.waiters++
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	h.mu.Unlock()
	h.ensure(ctx, d)
	return s, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, id := range ids {
			delete(g[id], s)
			if len(g[id]) == 0 {
				delete(g, id)
			}
		}
		if len(g) == 0 {
			delete(h.subs, group)
		}
		h.waiters--
		if h.waiters == 0 && h.r != nil && !h.closed {
			h.linger = time.AfterFunc(settleLinger, h.idle)
		}
	}
}

// ensure starts the reader if none runs (after a start that failed, not
// before settleRetryStart).
func (h *settleHub) ensure(ctx context.Context, d *Driver) {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	h.mu.Lock()
	skip := h.r != nil || h.closed || time.Now().Before(h.retryAt)
	h.mu.Unlock()
	if skip {
		return
	}
	// Not the waiter's context: its end must not stop the reader it
	// starts for everyone, nor count as a failure to start.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	r, err := d.startSettleReader(sctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.retryAt = time.Now().Add(settleRetryStart)
		if !h.warned {
			h.warned = true
			d.cfg.Logger.Warn("ferrymysql: settlement cannot follow the binlog; AwaitSettled reads its events again every "+settleSafetyNet.String()+" instead",
				"err", err)
		}
		return
	}
	if h.closed {
		go r.stop()
		return
	}
	h.r = r
	// Whatever a waiter read before may have changed while no reader ran.
	h.markAllDirty()
}

func (h *settleHub) markAllDirty() {
	for _, g := range h.subs {
		for _, m := range g {
			for s := range m {
				select {
				case s.dirty <- struct{}{}:
				default:
				}
			}
		}
	}
}

// idle stops the reader if no waiter came back during the linger.
func (h *settleHub) idle() {
	h.mu.Lock()
	r := h.r
	if h.waiters > 0 || r == nil {
		h.mu.Unlock()
		return
	}
	h.r, h.linger = nil, nil
	h.mu.Unlock()
	r.stop()
}

// failed is the reader's report that its stream broke: waiters read
// again, and a new reader starts soon if any remain.
func (h *settleHub) broke(d *Driver, r *settleReader, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.r != r {
		return // stopped on purpose
	}
	h.r = nil
	h.markAllDirty()
	d.cfg.Logger.Warn("ferrymysql: the settlement binlog reader stopped; restarting it", "err", err)
	go r.stop()
	if h.waiters > 0 && !h.closed {
		time.AfterFunc(settleRestart, func() {
			h.mu.Lock()
			n := h.waiters
			h.mu.Unlock()
			if n > 0 {
				h.ensure(context.Background(), d)
			}
		})
	}
}

func (h *settleHub) listen(n int) {
	h.mu.Lock()
	h.listening += n
	h.mu.Unlock()
}

// notify wakes the waiters of (group, id).
func (h *settleHub) notify(group string, id uuid.UUID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs[group][id] {
		h.notes++
		select {
		case s.notes <- id:
		default:
			select {
			case s.dirty <- struct{}{}:
			default:
			}
		}
	}
}

func (h *settleHub) waited(group string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs[group]) > 0
}

// close stops the reader for good.
func (h *settleHub) close() {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	h.mu.Lock()
	r := h.r
	h.r, h.closed = nil, true
	if h.linger != nil {
		h.linger.Stop()
	}
	h.mu.Unlock()
	if r != nil {
		r.stop()
	}
}

// startSettleReader opens the binlog at its end and follows it.
func (d *Driver) startSettleReader(ctx context.Context) (*settleReader, error) {
	// Only ferry_inbox's new rows are decoded: the server's other tables
	// (the outbox's payloads among them) are skipped unread.
	syncer, err := d.binlogSyncer("settlement", func(e *replication.RowsEvent) bool {
		t := e.Type()
		return e.Table != nil && string(e.Table.Table) == "ferry_inbox" && string(e.Table.Schema) == d.schema &&
			(t == replication.EnumRowsEventTypeInsert || t == replication.EnumRowsEventTypeUpdate)
	})
	if err != nil {
		return nil, err
	}
	file, pos, err := masterStatus(ctx, d.db)
	if err != nil || file == "" {
		syncer.Close()
		if err == nil {
			err = fmt.Errorf("the server writes no binlog (log_bin is off)")
		}
		return nil, fmt.Errorf("ferrymysql: settlement: read the binlog's end: %w", err)
	}
	streamer, err := syncer.StartSync(gomysql.Position{Name: file, Pos: pos})
	if err != nil {
		syncer.Close()
		return nil, fmt.Errorf("ferrymysql: settlement: read the binlog from %s:%d: %w", file, pos, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &settleReader{syncer: syncer, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		cols := map[uint64]*inboxColumns{}
		for {
			ev, err := streamer.GetEvent(rctx)
			if err != nil {
				if rctx.Err() == nil {
					d.settle.broke(d, r, err)
				}
				return
			}
			d.settleEvent(ev, cols)
		}
	}()
	return r, nil
}

// inboxColumns are the positions of the columns of ferry_inbox a waiter
// needs, in a table map's rows (by name: binlog_row_metadata = FULL).
type inboxColumns struct {
	group, eventID, state int
}

// settleEvent wakes the waiters of the finished rows of ferry_inbox that
// ev carries. cols caches the column positions by table ID (a table map
// event, decoded anew for each transaction, keeps its table's ID until
// the table changes).
func (d *Driver) settleEvent(ev *replication.BinlogEvent, cols map[uint64]*inboxColumns) {
	e, ok := ev.Event.(*replication.RowsEvent)
	if !ok || e.Table == nil || string(e.Table.Table) != "ferry_inbox" || string(e.Table.Schema) != d.schema {
		return
	}
	step, first := 1, 0
	switch ev.Header.EventType {
	case replication.WRITE_ROWS_EVENTv0, replication.WRITE_ROWS_EVENTv1, replication.WRITE_ROWS_EVENTv2, replication.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1:
	case replication.UPDATE_ROWS_EVENTv0, replication.UPDATE_ROWS_EVENTv1, replication.UPDATE_ROWS_EVENTv2, replication.MARIADB_UPDATE_ROWS_COMPRESSED_EVENT_V1:
		step, first = 2, 1 // before and after images: the after ones
	default:
		return
	}
	c := cols[e.TableID]
	if c == nil {
		at := map[string]int{}
		for i, n := range e.Table.ColumnNameString() {
			at[n] = i
		}
		g, ok1 := at["group_name"]
		id, ok2 := at["event_id"]
		st, ok3 := at["state"]
		if !ok1 || !ok2 || !ok3 {
			d.cfg.Logger.Warn("ferrymysql: settlement: the binlog's map of ferry_inbox has no column names (binlog_row_metadata must be FULL): waiters read again every " + settleSafetyNet.String())
			c = &inboxColumns{group: -1}
		} else {
			c = &inboxColumns{group: g, eventID: id, state: st}
		}
		if len(cols) >= 16 {
			clear(cols) // the table was changed (or recreated) many times
		}
		cols[e.TableID] = c
	}
	if c.group < 0 {
		return
	}
	for i := first; i < len(e.Rows); i += step {
		row := e.Rows[i]
		if len(row) <= max(c.group, c.eventID, c.state) {
			continue
		}
		state := ferrydriver.InboxState(bytesOf(row[c.state]))
		if !state.Finished() {
			continue
		}
		group := string(bytesOf(row[c.group]))
		if !d.settle.waited(group) {
			continue
		}
		// BINARY(16) loses its trailing zero bytes in the row image.
		raw := bytesOf(row[c.eventID])
		if len(raw) < 16 {
			raw = append(raw, make([]byte, 16-len(raw))...)
		}
		id, err := uuid.FromBytes(raw)
		if err != nil {
			continue
		}
		d.settle.notify(group, id)
	}
}

// AwaitSettled implements ferrydriver.Settler (see above).
func (d *Driver) AwaitSettled(ctx context.Context, p *ferrydriver.AwaitSettledParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	sub, unsubscribe := d.settle.subscribe(ctx, d, p.Group, p.EventIDs)
	defer unsubscribe()
	// The read below covers whatever a reader's start marked dirty so
	// far (this waiter's own start among it).
	select {
	case <-sub.dirty:
	default:
	}
	states, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: p.Group, EventIDs: p.EventIDs})
	if err != nil {
		return nil, err
	}
	pending := map[uuid.UUID]bool{}
	for _, id := range p.EventIDs {
		if row := states[id]; row == nil || !row.State.Finished() {
			pending[id] = true
		}
	}
	if len(pending) == 0 {
		return states, nil
	}
	d.settle.listen(1)
	defer d.settle.listen(-1)
	deadline := time.NewTimer(time.Until(p.Deadline))
	defer deadline.Stop()
	safety := time.NewTicker(settleSafetyNet)
	defer safety.Stop()
	// Events the binlog said finished that a read did not show yet (InnoDB
	// makes a commit visible just after writing its binlog): read again
	// soon, waiting a little longer each time.
	noted := map[uuid.UUID]bool{}
	var soon *time.Timer
	var soonC <-chan time.Time
	soonWait := time.Millisecond
	defer func() {
		if soon != nil {
			soon.Stop()
		}
	}()
	all := func() []uuid.UUID {
		out := make([]uuid.UUID, 0, len(pending))
		for id := range pending {
			out = append(out, id)
		}
		return out
	}
	for len(pending) > 0 {
		var reread []uuid.UUID
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			return states, nil // what is left is pending
		case id := <-sub.notes:
			noted[id] = true
		drain:
			for {
				select {
				case id := <-sub.notes:
					noted[id] = true
				default:
					break drain
				}
			}
			for id := range noted {
				if pending[id] {
					reread = append(reread, id)
				} else {
					delete(noted, id)
				}
			}
		case <-soonC:
			soonC = nil
			for id := range noted {
				reread = append(reread, id)
			}
		case <-sub.dirty:
			reread = all()
		case <-safety.C:
			reread = all()
		}
		if len(reread) == 0 {
			continue
		}
		fresh, err := d.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: p.Group, EventIDs: reread})
		if err != nil {
			return nil, err
		}
		for _, id := range reread {
			row, ok := fresh[id]
			if !ok {
				continue
			}
			states[id] = row
			if row.State.Finished() {
				delete(pending, id)
				delete(noted, id)
			}
		}
		if len(noted) > 0 && soonC == nil {
			if soon == nil {
				soon = time.NewTimer(soonWait)
			} else {
				soon.Reset(soonWait)
			}
			soonC = soon.C
			soonWait = min(2*soonWait, 100*time.Millisecond)
		}
	}
	return states, nil
}
