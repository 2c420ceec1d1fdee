package ferrypg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
)

// notifyFinished tells the callers awaiting rows that they finished, in
// the states the rows say.
func (d *Driver[TTx]) notifyFinished(ctx context.Context, e executor, group string, finished []*ferrydriver.InboxRow) error {
	ids, states := make([]uuid.UUID, len(finished)), make([]string, len(finished))
	for i, r := range finished {
		ids[i], states[i] = r.Event.ID, string(r.State)
	}
	return d.notifySettled(ctx, e, group, ids, states)
}

func (d *Driver[TTx]) notifySettled(ctx context.Context, e executor, group string, ids []uuid.UUID, states []string) error {
	var n int
	if err := queryRow(ctx, e, []any{&n}, d.queries.inboxNotify, group, ids, states, d.settleChannel()); err != nil {
		return d.wrapErr("notify settlement waiters", err)
	}
	return nil
}

func (d *Driver[TTx]) settleChannel() string { return d.cfg.Schema + ".settle" }

func idStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// InboxStates implements ferrydriver.Settler.
func (d *Driver[TTx]) InboxStates(ctx context.Context, p *ferrydriver.InboxIDsParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	return d.inboxStates(ctx, d.db, p.Group, p.EventIDs, false)
}

func (d *Driver[TTx]) inboxStates(ctx context.Context, e executor, group string, ids []uuid.UUID, lock bool) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	q := d.queries.inboxStates
	if lock {
		// Wait for a finisher that already updated a row to commit, so that
		// its outcome is seen (its NOTIFY predates our waiter).
		q += " FOR SHARE OF i"
	}
	r, err := e.query(ctx, q, group, idStrings(ids))
	if err != nil {
		return nil, d.wrapErr("read inbox states of group "+group, err)
	}
	rows, err := scanInboxRows(r, group)
	if err != nil {
		return nil, d.wrapErr("read inbox states of group "+group, err)
	}
	out := make(map[uuid.UUID]*ferrydriver.InboxRow, len(rows))
	for _, row := range rows {
		out[row.Event.ID] = row
	}
	return out, nil
}

// lastReadTimeout bounds AwaitSettled's read at its deadline.
const lastReadTimeout = 2 * time.Second

// AwaitSettled implements ferrydriver.Settler. It subscribes to the
// driver's settlement hub (one LISTEN connection shared by all callers),
// registers a waiter row (finishing one of the events then notifies), reads
// the events' states once (FOR SHARE, so that a finisher that missed the
// waiter has committed by then), and then only waits: one notification per
// finished event, no polling, and one last read at the deadline.
func (d *Driver[TTx]) AwaitSettled(ctx context.Context, p *ferrydriver.AwaitSettledParams) (map[uuid.UUID]*ferrydriver.InboxRow, error) {
	if !d.canWait {
		return nil, errors.New("ferrypg: AwaitSettled needs LISTEN/NOTIFY: use a pgx pool or database/sql with the pgx driver")
	}
	// Setting up is bounded by the deadline too: past it, the answer is
	// "pending".
	setup, cancelSetup := context.WithDeadline(ctx, p.Deadline)
	defer cancelSetup()
	sub, unsubscribe, err := d.hub.subscribe(setup, p.EventIDs)
	if err != nil {
		if errors.Is(err, errNotListening) {
			// Not "pending": nothing could have told us otherwise.
			return nil, fmt.Errorf("%w (AwaitSettled waited until its deadline; check the database connection and the role's rights)", err)
		}
		if ctx.Err() == nil && setup.Err() != nil {
			return map[uuid.UUID]*ferrydriver.InboxRow{}, nil
		}
		return nil, d.wrapErr("listen for settlement", err)
	}
	defer unsubscribe()
	waiter := uuid.New()
	if _, err := d.db.exec(setup, d.queries.waiterAdd, waiter, p.Group, idStrings(p.EventIDs), p.Deadline); err != nil {
		if ctx.Err() == nil && setup.Err() != nil {
			return map[uuid.UUID]*ferrydriver.InboxRow{}, nil
		}
		return nil, d.wrapErr("register settlement waiter", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = d.db.exec(rctx, d.queries.waiterRemove, waiter)
	}()
	states, err := d.inboxStates(setup, d.db, p.Group, p.EventIDs, true)
	if err != nil {
		if ctx.Err() == nil && setup.Err() != nil {
			return map[uuid.UUID]*ferrydriver.InboxRow{}, nil
		}
		return nil, err
	}
	pending := map[uuid.UUID]bool{}
	for _, id := range p.EventIDs {
		if row, ok := states[id]; !ok || !row.State.Finished() {
			pending[id] = true
		}
	}
	timer := time.NewTimer(time.Until(p.Deadline))
	defer timer.Stop()
	for len(pending) > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			// The deadline: what is left is pending, as a last read finds
			// it (a notification can be missed: a connection that dropped
			// and came back between two reads).
			last, cancel := context.WithTimeout(ctx, lastReadTimeout)
			fresh, err := d.inboxStates(last, d.db, p.Group, p.EventIDs, false)
			cancel()
			if err == nil {
				for id := range pending {
					if row, ok := fresh[id]; ok {
						states[id] = row
					}
				}
			}
			return states, nil
		case <-sub.dirty:
			// Notifications may have been missed: read again.
			fresh, err := d.inboxStates(ctx, d.db, p.Group, p.EventIDs, false)
			if err != nil {
				return nil, err
			}
			for id := range pending {
				if row, ok := fresh[id]; ok {
					states[id] = row
					if row.State.Finished() {
						delete(pending, id)
					}
				}
			}
		case payload := <-sub.notes:
			idText, state, _ := strings.Cut(payload, ":")
			id, perr := uuid.Parse(idText)
			if perr != nil || !pending[id] {
				continue
			}
			delete(pending, id)
			if ferrydriver.InboxState(state) == ferrydriver.InboxProcessed && states[id] != nil {
				states[id].State = ferrydriver.InboxProcessed
				continue
			}
			// A failure (or a row not seen before): read it for the reason.
			one, err := d.inboxStates(ctx, d.db, p.Group, []uuid.UUID{id}, false)
			if err != nil {
				return nil, err
			}
			if row := one[id]; row != nil {
				states[id] = row
			}
		}
	}
	return states, nil
}
