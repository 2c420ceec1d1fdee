package ferrypg

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/jackc/pgx/v5"
)

// parkQueries are the parked-event statements with the schema filled in.
type parkQueries struct {
	park, headsOf, heads, redriven, unpark, hold, attempts, release, listLeases string
}

func newParkQueries(schema string) parkQueries {
	s := pgx.Identifier{schema}.Sanitize()
	r := func(q string) string { return strings.ReplaceAll(q, "{schema}", s) }
	return parkQueries{park: r(sqlParkEvents), headsOf: r(sqlParkedHeadsOf), heads: r(sqlParkedHeads), redriven: r(sqlParkedRedriven),
		unpark: r(sqlUnparkEvent), hold: r(sqlHoldParked), attempts: r(sqlSetParkedAttempts), release: r(sqlReleaseParked), listLeases: r(sqlListLeases)}
}

// fenced runs a statement that returns the number of matching lease rows.
func (d *Driver[TTx]) fenced(ctx context.Context, op, feed string, term int64, q string, args ...any) error {
	var held int
	if err := queryRow(ctx, d.db, []any{&held}, q, args...); err != nil {
		return d.wrapErr(op+" of "+feed, err)
	}
	if held == 0 {
		return fmt.Errorf("ferrypg: %s of %s at term %d: %w", op, feed, term, ferrydriver.ErrLeaseLost)
	}
	return nil
}

// ParkEvents implements ferrydriver.Store.
func (d *Driver[TTx]) ParkEvents(ctx context.Context, p *ferrydriver.ParkEventsParams) error {
	if len(p.Events) == 0 {
		return nil
	}
	a, err := encodeEvents(p.Events)
	if err != nil {
		return err
	}
	return d.fenced(ctx, "park events", p.Feed, p.Term, d.park.park, p.Feed, p.Holder, p.Term,
		a.ids, a.topics, a.keys, a.seqs, a.types, a.sources, a.contentTypes, a.headers, a.payloads, a.created, p.Reason)
}

// ParkedHeads implements ferrydriver.Store.
func (d *Driver[TTx]) ParkedHeads(ctx context.Context, p *ferrydriver.ParkedHeadsParams) ([]*ferrydriver.ParkedEvent, error) {
	var (
		r   rows
		err error
	)
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	switch {
	case p.Keys != nil:
		r, err = d.db.query(ctx, d.park.headsOf, p.Feed, p.Keys)
	case p.Redriven:
		r, err = d.db.query(ctx, d.park.redriven, p.Feed, limit)
	default:
		r, err = d.db.query(ctx, d.park.heads, p.Feed, limit)
	}
	if err != nil {
		return nil, d.wrapErr("read parked events of "+p.Feed, err)
	}
	defer r.Close()
	var out []*ferrydriver.ParkedEvent
	for r.Next() {
		pe := &ferrydriver.ParkedEvent{Feed: p.Feed}
		ev := &pe.Event
		var headers *string
		if err := r.Scan(&ev.ID, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &ev.CreatedAt,
			&pe.ParkedAt, &pe.Held, &pe.Reason, &pe.Redriven, &pe.Attempts, &pe.FirstFailure, &pe.Queued); err != nil {
			return nil, d.wrapErr("read parked events of "+p.Feed, err)
		}
		if pe.FirstFailure.Unix() == 0 {
			pe.FirstFailure = time.Time{}
		}
		if err := decodeHeaders(ev, headers); err != nil {
			return nil, fmt.Errorf("ferrypg: parked event of %s: %w", p.Feed, err)
		}
		out = append(out, pe)
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("read parked events of "+p.Feed, err)
	}
	return out, nil
}

// UnparkEvent implements ferrydriver.Store.
func (d *Driver[TTx]) UnparkEvent(ctx context.Context, p *ferrydriver.UnparkEventParams) error {
	var reason *string
	if p.DeadLetter != nil {
		reason = &p.DeadLetter.Reason
	}
	return d.fenced(ctx, "unpark an event", p.Feed, p.Term, d.park.unpark, p.Feed, p.Holder, p.Term, p.Key, p.EventID, reason)
}

// HoldParked implements ferrydriver.Store.
func (d *Driver[TTx]) HoldParked(ctx context.Context, p *ferrydriver.HoldParkedParams) error {
	return d.fenced(ctx, "hold a parked key", p.Feed, p.Term, d.park.hold, p.Feed, p.Holder, p.Term, p.Key, p.EventID, p.Reason)
}

// SetParkedAttempts implements ferrydriver.Store.
func (d *Driver[TTx]) SetParkedAttempts(ctx context.Context, p *ferrydriver.SetParkedAttemptsParams) error {
	var first *time.Time
	if !p.FirstFailure.IsZero() {
		first = &p.FirstFailure
	}
	return d.fenced(ctx, "record the attempts of a parked key", p.Feed, p.Term, d.park.attempts, p.Feed, p.Holder, p.Term, p.Key, p.EventID, p.Attempts, first)
}

// ReleaseParked implements ferrydriver.Store.
func (d *Driver[TTx]) ReleaseParked(ctx context.Context, p *ferrydriver.ReleaseParkedParams) error {
	var n int
	if err := queryRow(ctx, d.db, []any{&n}, d.park.release, p.Feed, p.Key, p.Skip); err != nil {
		return d.wrapErr("release parked key "+p.Key+" of "+p.Feed, err)
	}
	if n == 0 {
		return fmt.Errorf("ferrypg: key %q of feed %s has nothing parked: %w", p.Key, p.Feed, ferrydriver.ErrNotFound)
	}
	return nil
}

// ListLeases implements ferrydriver.Store.
func (d *Driver[TTx]) ListLeases(ctx context.Context, prefix string) ([]*ferrydriver.Lease, error) {
	r, err := d.db.query(ctx, d.park.listLeases, prefix)
	if err != nil {
		return nil, d.wrapErr("list leases "+prefix+"*", err)
	}
	defer r.Close()
	var out []*ferrydriver.Lease
	for r.Next() {
		l := &ferrydriver.Lease{}
		if err := r.Scan(scanLease(nil, l)...); err != nil {
			return nil, d.wrapErr("list leases "+prefix+"*", err)
		}
		out = append(out, l)
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("list leases "+prefix+"*", err)
	}
	return out, nil
}
