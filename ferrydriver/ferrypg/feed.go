package ferrypg

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/jackc/pgx/v5"
)

// feedState is the feed position, serialised as the checkpoint cursor.
//
// The feed delivers batch after batch; batch n is every row that became
// visible between snapshot n-1 ("prev") and snapshot n ("cur"). Within a
// batch, rows are delivered in id order and After is the last id delivered.
type feedState struct {
	V int `json:"v"`
	// Low is the highest id visible at the previous snapshot: every row at
	// or below it that was visible then was delivered in earlier batches.
	Low int64 `json:"low"`
	// High is the highest id visible at the current snapshot.
	High int64 `json:"high"`
	// After is the last id delivered in the current batch (0 before any).
	After int64 `json:"after"`
	// PrevXmax/PrevXip and CurXmax/CurXip are the two snapshots: a
	// transaction is invisible to a snapshot if its xid is in Xip or at or
	// above Xmax. Note that Xmax is latestCompletedXid+1, not the next xid
	// to be assigned: a transaction running at the snapshot may have an xid
	// at or above Xmax and then it is not listed in Xip.
	PrevXmax uint64   `json:"prev_xmax,omitempty"`
	PrevXip  []uint64 `json:"prev_xip,omitempty"`
	CurXmax  uint64   `json:"cur_xmax,omitempty"`
	CurXip   []uint64 `json:"cur_xip,omitempty"`
	// Late lists the transactions at or above PrevXmax that wrote rows at
	// or below Low and had committed by the current snapshot; found once
	// per batch by a range scan of outbox_xid_idx.
	Late []uint64 `json:"late,omitempty"`
	// Done marks the current batch as fully delivered.
	Done bool `json:"done"`
}

// delivered is an id at or below which every non-straggler row was delivered.
func (s *feedState) delivered() int64 {
	if s.Done {
		return s.High
	}
	return max(s.Low, s.After)
}

func decodeCursor(b []byte) (*feedState, error) {
	st := &feedState{V: 1, Done: true}
	if len(b) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(b, st); err != nil || st.V != 1 {
		return nil, fmt.Errorf("ferrypg: checkpoint cursor %q is not a ferrypg cursor (was it written by another backend?): %v", truncate(string(b), 80), err)
	}
	return st, nil
}

func (s *feedState) encode() []byte {
	b, _ := json.Marshal(s)
	return b
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// stragglers are the transactions invisible at prev and visible at cur
// whose rows may lie at or below Low: those listed in PrevXip that are not
// in CurXip, and Late.
func (s *feedState) stragglers() []string {
	running := make(map[uint64]struct{}, len(s.CurXip))
	for _, x := range s.CurXip {
		running[x] = struct{}{}
	}
	out := make([]string, 0, len(s.PrevXip)+len(s.Late))
	for _, x := range s.PrevXip {
		if _, ok := running[x]; !ok {
			out = append(out, strconv.FormatUint(x, 10))
		}
	}
	for _, x := range s.Late {
		out = append(out, strconv.FormatUint(x, 10))
	}
	return out
}

func xidStrings(xs []uint64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = strconv.FormatUint(x, 10)
	}
	return out
}

// parseSnapshot parses pg_snapshot text "xmin:xmax:xip1,xip2,...".
func parseSnapshot(s string) (xmax uint64, xip []uint64, err error) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return 0, nil, fmt.Errorf("unexpected snapshot %q", s)
	}
	if xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return 0, nil, fmt.Errorf("unexpected snapshot %q: %w", s, err)
	}
	if parts[2] == "" {
		return xmax, nil, nil
	}
	fields := strings.Split(parts[2], ",")
	xip = make([]uint64, len(fields))
	for i, f := range fields {
		if xip[i], err = strconv.ParseUint(f, 10, 64); err != nil {
			return 0, nil, fmt.Errorf("unexpected snapshot %q: %w", s, err)
		}
	}
	return xmax, xip, nil
}

type feed[TTx any] struct {
	d         *Driver[TTx]
	name      string
	partition int
	st        *feedState
	listen    bool
	// sess is the feed's dedicated session; nil after an error, reopened
	// on the next call.
	sess *session
	// armedUntil is when the listeners row this feed wrote expires (local
	// clock, conservative).
	armedUntil time.Time
	// hotUntil: events came lately, so the feed polls every hotTick
	// instead of asking producers to notify. A busy relay thus never makes
	// producers send NOTIFY, whose commit-time lock would serialise them.
	// tickedAt is when the last tick's read returned.
	hotUntil, tickedAt time.Time
}

// While events keep coming, the feed looks again every hotTick, for
// hotWindow after the last batch or wake-up that brought any.
const (
	hotTick   = 3 * time.Millisecond
	hotWindow = 250 * time.Millisecond
)

// OpenFeed implements ferrydriver.Store.
func (d *Driver[TTx]) OpenFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) (ferrydriver.Feed, error) {
	if err := d.checkFeed(ctx, p); err != nil {
		return nil, err
	}
	st, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, err
	}
	var cache int64
	if err := queryRow(ctx, d.db, []any{&cache}, d.queries.seqCache, d.cfg.Schema); err != nil {
		return nil, d.wrapErr("check the outbox sequence", err)
	}
	if cache != 1 {
		return nil, fmt.Errorf("ferrypg: sequence %s.outbox_id_seq has CACHE %d: the feed needs ids drawn in time order; run ALTER SEQUENCE %s.outbox_id_seq CACHE 1",
			d.cfg.Schema, cache, pgx.Identifier{d.cfg.Schema}.Sanitize())
	}
	f := &feed[TTx]{d: d, name: p.Feed, partition: p.Partition, st: st, listen: d.canWait && !d.cfg.DisableNotify}
	if _, err := f.session(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// session returns the feed's session, opening it if needed.
func (f *feed[TTx]) session(ctx context.Context) (*session, error) {
	if f.sess != nil {
		return f.sess, nil
	}
	s, err := f.d.openSession(ctx, f.name, f.partition, f.listen)
	if err != nil {
		return nil, f.d.wrapErr("open feed session", err)
	}
	f.sess = s
	f.armedUntil = time.Time{} // a new session has no LISTEN history
	return s, nil
}

// fail drops the session after an error so that the next call reconnects.
func (f *feed[TTx]) fail(err error, op string) error {
	if f.sess != nil {
		f.sess.close()
		f.sess = nil
	}
	return f.d.wrapErr(op+" ("+f.name+")", err)
}

func (f *feed[TTx]) Close() error {
	if f.sess != nil {
		f.sess.close()
		f.sess = nil
	}
	return nil
}

// tickRead closes the next batch at a fresh snapshot and reads its first
// rows (see sqlTickRead). The feed's state changes only on success.
func (f *feed[TTx]) tickRead(ctx context.Context, limit int) (*ferrydriver.Batch, error) {
	sess, err := f.session(ctx)
	if err != nil {
		return nil, err
	}
	old := f.st
	low := max(old.High, old.Low)
	r, err := sess.exec.query(ctx, f.d.queries.tickRead, f.partition, limit, low,
		strconv.FormatUint(old.CurXmax, 10), xidStrings(old.CurXip))
	if err != nil {
		return nil, f.fail(err, "read feed")
	}
	defer r.Close()
	var (
		header    bool
		snap      *string
		high      *int64
		late      *string
		k         int
		b         = &ferrydriver.Batch{}
		n         int
		after     int64
		st        = &feedState{V: 1, PrevXmax: old.CurXmax, PrevXip: old.CurXip, Low: low}
		cols      = make([]any, 0, 15)
		eventCols = func(ev *ferryevent.Event, id *int64, headers **string) []any {
			return append(cols[:0], &k, &snap, &high, &late, id, &ev.ID, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, headers, &ev.Payload, &ev.CreatedAt)
		}
	)
	for r.Next() {
		ev := &ferryevent.Event{}
		var id int64
		var headers *string
		if err := r.Scan(eventCols(ev, &id, &headers)...); err != nil {
			return nil, f.fail(err, "read feed")
		}
		if k == 0 {
			if snap == nil || high == nil || late == nil {
				return nil, fmt.Errorf("ferrypg: feed header row is incomplete")
			}
			if st.CurXmax, st.CurXip, err = parseSnapshot(*snap); err != nil {
				return nil, fmt.Errorf("ferrypg: %w", err)
			}
			if st.Late, err = parseXids(*late); err != nil {
				return nil, fmt.Errorf("ferrypg: %w", err)
			}
			st.High = max(*high, low)
			header = true
			continue
		}
		n++
		after = max(after, id)
		f.collect(b, ev, headers)
	}
	if err := r.Err(); err != nil {
		return nil, f.fail(err, "read feed")
	}
	if !header {
		return nil, fmt.Errorf("ferrypg: feed query returned no header row")
	}
	st.After = after
	st.Done = n < limit
	f.st = st
	b.Cursor = st.encode()
	return b, nil
}

// collect adds a scanned row to b, as an event or, if it is not a valid
// event, as an invalid record.
func (f *feed[TTx]) collect(b *ferrydriver.Batch, ev *ferryevent.Event, headers *string) {
	if err := decodeHeaders(ev, headers); err != nil {
		b.Invalid = append(b.Invalid, invalidRecord(ev, "invalid outbox row: "+err.Error()))
		return
	}
	if err := ferryevent.CheckRelayable(ev); err != nil {
		b.Invalid = append(b.Invalid, invalidRecord(ev, "invalid outbox row: "+err.Error()))
		return
	}
	b.Events = append(b.Events, ev)
}

func parseXids(s string) ([]uint64, error) {
	if s == "" {
		return nil, nil
	}
	fields := strings.Split(s, ",")
	out := make([]uint64, len(fields))
	for i, x := range fields {
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("unexpected xid %q", x)
		}
		out[i] = v
	}
	return out, nil
}

// Read implements ferrydriver.Feed.
func (f *feed[TTx]) Read(ctx context.Context, p *ferrydriver.ReadParams) (*ferrydriver.Batch, error) {
	limit := p.Max
	if limit <= 0 {
		limit = 500
	}
	var deadline time.Time
	for {
		ticked := f.st.Done
		var batch *ferrydriver.Batch
		var err error
		if ticked {
			if err := f.pace(ctx, p.Wait, deadline); err != nil {
				return nil, err
			}
			batch, err = f.tickRead(ctx, limit)
			f.tickedAt = time.Now()
		} else {
			batch, err = f.read(ctx, limit)
		}
		if err != nil {
			return nil, err
		}
		if len(batch.Events)+len(batch.Invalid) > 0 {
			if f.listen {
				f.hotUntil = time.Now().Add(hotWindow)
			}
			return batch, nil
		}
		if !ticked {
			return batch, nil
		}
		// Nothing new at a fresh snapshot: wait for a wake-up, then tick again.
		if deadline.IsZero() {
			deadline = time.Now().Add(p.Wait)
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return batch, nil
		}
		if time.Now().Before(f.hotUntil) {
			// Busy lately: look again at the next tick, without waking
			// producers' NOTIFY.
			continue
		}
		if armed, err := f.arm(ctx, p.Wait); err != nil {
			return nil, err
		} else if armed {
			// Producers may have committed without notifying before the
			// row was visible: look once more before sleeping.
			continue
		}
		woken, err := f.wait(ctx, wait)
		if err != nil {
			return nil, err
		}
		if woken {
			// Events are coming: stop producers notifying, and poll while
			// they keep coming.
			if err := f.disarm(ctx); err != nil {
				return nil, err
			}
			f.hotUntil = time.Now().Add(hotWindow)
			f.tickedAt = time.Time{} // a commit woke it: look now
		}
	}
}

// pace waits, while the feed is hot, until hotTick after the last tick
// ended, never longer than the read's wait or past its deadline (if set).
// A tick right after one that returned events would find the few
// committed since (at 1,000 events/s, none half the time): two reads for
// the events of one. Counted from its end, a slow tick still leaves a
// pause.
func (f *feed[TTx]) pace(ctx context.Context, wait time.Duration, deadline time.Time) error {
	if !time.Now().Before(f.hotUntil) {
		return nil
	}
	wait = min(wait, time.Until(f.tickedAt.Add(hotTick)))
	if !deadline.IsZero() {
		wait = min(wait, time.Until(deadline))
	}
	if wait <= 0 {
		return nil
	}
	return sleepCtx(ctx, wait)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// disarm tells producers that this relay is no longer idle, if it had said
// it was.
func (f *feed[TTx]) disarm(ctx context.Context) error {
	if f.armedUntil.IsZero() || time.Now().After(f.armedUntil) {
		return nil
	}
	sess, err := f.session(ctx)
	if err != nil {
		return err
	}
	if _, err := sess.exec.exec(ctx, f.d.queries.disarmListener, f.partition); err != nil {
		return f.fail(err, "register busy relay")
	}
	f.armedUntil = time.Time{}
	return nil
}

// read returns the next rows of the current batch. The feed's state
// changes only if the whole result was read.
func (f *feed[TTx]) read(ctx context.Context, limit int) (*ferrydriver.Batch, error) {
	sess, err := f.session(ctx)
	if err != nil {
		return nil, err
	}
	st := f.st
	r, err := sess.exec.query(ctx, f.d.queries.readBatch,
		f.partition, max(st.After, st.Low), st.High, xidStrings(st.CurXip), limit, strconv.FormatUint(st.CurXmax, 10),
		st.stragglers(), st.After, st.Low)
	if err != nil {
		return nil, f.fail(err, "read feed")
	}
	defer r.Close()
	b := &ferrydriver.Batch{}
	n := 0
	after := st.After
	for r.Next() {
		ev := &ferryevent.Event{}
		var id int64
		var headers *string
		if err := r.Scan(&id, &ev.ID, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &ev.CreatedAt); err != nil {
			return nil, f.fail(err, "read feed")
		}
		n++
		after = max(after, id)
		f.collect(b, ev, headers)
	}
	if err := r.Err(); err != nil {
		return nil, f.fail(err, "read feed")
	}
	next := *st
	next.After = after
	next.Done = n < limit
	f.st = &next
	b.Cursor = next.encode()
	return b, nil
}

// arm makes producers notify for the next while, unless they already do.
// It reports whether it wrote the listeners row.
func (f *feed[TTx]) arm(ctx context.Context, wait time.Duration) (bool, error) {
	if !f.listen || time.Until(f.armedUntil) > 2*wait {
		return false, nil
	}
	sess, err := f.session(ctx)
	if err != nil {
		return false, err
	}
	span := 10 * max(wait, 100*time.Millisecond)
	start := time.Now()
	if _, err := sess.exec.exec(ctx, f.d.queries.armListener, f.partition, span.Milliseconds()); err != nil {
		return false, f.fail(err, "register idle relay")
	}
	f.armedUntil = start.Add(span)
	return true, nil
}

// drain consumes notifications that are already queued: one tick covers
// every commit before it, so a burst of N commits must cost one tick, not N.
func (f *feed[TTx]) drain(ctx context.Context) {
	deadline := time.Now().Add(2 * time.Millisecond)
	for time.Now().Before(deadline) {
		dctx, cancel := context.WithTimeout(ctx, 50*time.Microsecond)
		_, err := f.sess.wait(dctx)
		cancel()
		if err != nil {
			if dctx.Err() == nil && ctx.Err() == nil {
				_ = f.fail(err, "drain notifications")
			}
			return
		}
	}
}

// wait blocks until a notification arrives (woken), d passes or ctx ends.
func (f *feed[TTx]) wait(ctx context.Context, d time.Duration) (woken bool, err error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if f.sess == nil || f.sess.wait == nil {
		<-wctx.Done()
		return false, ctx.Err()
	}
	_, err = f.sess.wait(wctx)
	switch {
	case err == nil:
		f.drain(ctx)
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	case wctx.Err() != nil:
		// Timed out. pgx interrupts the read with a deadline and keeps the
		// connection usable.
		return false, nil
	default:
		// The session failed: the next call reconnects. No event is lost;
		// wake-ups are only hints.
		f.d.cfg.Logger.Warn("ferrypg: feed session failed while waiting; reconnecting", "feed", f.name, "err", err)
		_ = f.fail(err, "wait")
		return false, nil
	}
}
