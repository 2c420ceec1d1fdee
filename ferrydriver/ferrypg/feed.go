package ferrypg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
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
	lis       listener // nil when polling only
	lisErr    time.Time
}

// OpenFeed implements ferrydriver.Store.
func (d *Driver[TTx]) OpenFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) (ferrydriver.Feed, error) {
	if p.Partition < 0 || p.Partition >= d.cfg.Partitions {
		return nil, fmt.Errorf("ferrypg: partition %d out of range: the schema is configured with %d partition(s)", p.Partition, d.cfg.Partitions)
	}
	st, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, err
	}
	f := &feed[TTx]{d: d, name: p.Feed, partition: p.Partition, st: st}
	if d.listen != nil && !d.cfg.DisableNotify {
		f.lis, err = d.listen(ctx, d.channel)
		if err != nil {
			return nil, d.wrapErr("listen for outbox notifications", err)
		}
	}
	return f, nil
}

func (f *feed[TTx]) Close() error {
	if f.lis != nil {
		f.lis.close()
		f.lis = nil
	}
	return nil
}

// tick closes the next batch at a fresh snapshot.
func (f *feed[TTx]) tick(ctx context.Context) error {
	var snap string
	var high int64
	if err := queryRow(ctx, f.d.db, []any{&snap, &high}, f.d.queries.tick, f.partition); err != nil {
		return f.d.wrapErr("take feed snapshot", err)
	}
	xmax, xip, err := parseSnapshot(snap)
	if err != nil {
		return fmt.Errorf("ferrypg: %w", err)
	}
	st := f.st
	st.PrevXmax, st.PrevXip = st.CurXmax, st.CurXip
	st.CurXmax, st.CurXip = xmax, xip
	st.Low = max(st.High, st.Low)
	st.High = max(high, st.Low)
	st.After = 0
	st.Done = false
	st.Late = st.Late[:0]
	if st.Low > 0 && st.CurXmax > st.PrevXmax {
		r, err := f.d.db.query(ctx, f.d.queries.lateXids, f.partition, st.Low,
			strconv.FormatUint(st.PrevXmax, 10), strconv.FormatUint(st.CurXmax, 10), xidStrings(st.CurXip))
		if err != nil {
			return f.d.wrapErr("find late transactions", err)
		}
		defer r.Close()
		for r.Next() {
			var x string
			if err := r.Scan(&x); err != nil {
				return f.d.wrapErr("find late transactions", err)
			}
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return fmt.Errorf("ferrypg: unexpected xid %q", x)
			}
			st.Late = append(st.Late, v)
		}
		if err := r.Err(); err != nil {
			return f.d.wrapErr("find late transactions", err)
		}
	}
	return nil
}

// Read implements ferrydriver.Feed.
func (f *feed[TTx]) Read(ctx context.Context, p *ferrydriver.ReadParams) (*ferrydriver.Batch, error) {
	limit := p.Max
	if limit <= 0 {
		limit = 500
	}
	var deadline time.Time
	for {
		ticked := false
		if f.st.Done {
			if err := f.tick(ctx); err != nil {
				return nil, err
			}
			ticked = true
		}
		batch, err := f.read(ctx, limit)
		if err != nil {
			return nil, err
		}
		if len(batch.Events)+len(batch.Invalid) > 0 || !ticked {
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
		if err := f.wait(ctx, wait); err != nil {
			return nil, err
		}
	}
}

func (f *feed[TTx]) read(ctx context.Context, limit int) (*ferrydriver.Batch, error) {
	st := f.st
	r, err := f.d.db.query(ctx, f.d.queries.readBatch,
		f.partition, max(st.After, st.Low), st.High, xidStrings(st.CurXip), limit, strconv.FormatUint(st.CurXmax, 10),
		st.stragglers(), st.After, st.Low)
	if err != nil {
		return nil, f.d.wrapErr("read feed "+f.name, err)
	}
	defer r.Close()
	b := &ferrydriver.Batch{}
	n := 0
	for r.Next() {
		ev := &ferryevent.Event{}
		id, err := scanEvent(r, ev)
		n++
		st.After = max(st.After, id)
		if err != nil {
			if id == 0 {
				return nil, f.d.wrapErr("read feed "+f.name, err)
			}
			b.Invalid = append(b.Invalid, invalidRecord(ev, err.Error()))
			continue
		}
		if verr := ferryevent.Validate(ev, 0, math.MaxInt); verr != nil {
			b.Invalid = append(b.Invalid, invalidRecord(ev, "invalid outbox row: "+verr.Error()))
			continue
		}
		b.Events = append(b.Events, ev)
	}
	if err := r.Err(); err != nil {
		return nil, f.d.wrapErr("read feed "+f.name, err)
	}
	if n < limit {
		st.Done = true
	}
	b.Cursor = st.encode()
	return b, nil
}

// wait blocks until a notification arrives, d passes or ctx ends.
func (f *feed[TTx]) wait(ctx context.Context, d time.Duration) error {
	if f.lis == nil && f.d.listen != nil && !f.d.cfg.DisableNotify && time.Since(f.lisErr) > 5*time.Second {
		lis, err := f.d.listen(ctx, f.d.channel)
		if err == nil {
			f.lis = lis
		} else {
			f.lisErr = time.Now()
		}
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if f.lis == nil {
		<-wctx.Done()
		return ctx.Err()
	}
	err := f.lis.wait(wctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded) || wctx.Err() != nil:
		return nil
	default:
		// The listening connection failed: fall back to polling and
		// reconnect later. No event is lost; wake-ups are only hints.
		f.d.cfg.Logger.Warn("ferrypg: outbox listener failed; polling until it reconnects", "feed", f.name, "err", err)
		f.lis.close()
		f.lis = nil
		f.lisErr = time.Now()
		return nil
	}
}
