package ferry

import (
	"context"
	"errors"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/google/uuid"
)

// Settlement is the state of events as seen by one consumer group.
type Settlement struct {
	// Settled events were processed: their handler committed.
	Settled []uuid.UUID
	// Failed events will not be processed (DEAD, discarded, retracted),
	// with the reason.
	Failed map[uuid.UUID]string
	// Pending events were not finished at the deadline, including events the
	// group has not received yet.
	Pending []uuid.UUID
}

// Done reports whether every event was settled.
func (s *Settlement) Done() bool { return len(s.Failed) == 0 && len(s.Pending) == 0 }

// Outcome names the settlement in one word, as metrics and spans label it:
// "failed" when any event failed, else "pending" when any is pending, else
// "settled".
func (s *Settlement) Outcome() string {
	switch {
	case len(s.Failed) > 0:
		return "failed"
	case len(s.Pending) > 0:
		return "pending"
	}
	return "settled"
}

// AwaitSettled waits until group has finished every event in ids, or
// timeout passes, and says which settled, which failed (and why) and which
// are still pending. It is woken by the database when an event finishes
// (it does not poll), and it reads on a connection of its own: called inside
// a request's transaction, it still sees the consumer's commits. The
// trailing hooks observe the wait: each SettleHook hears of its start and
// end (ferryotel records a span), each MetricsHook records it
// (ferry_settlement_wait_seconds, by outcome), so that
//
//	st, err := ferry.AwaitSettled(ctx, drv, "billing", ids, 2*time.Second, prom, tr)
//
// gives the metric and the span.
func AwaitSettled(ctx context.Context, s ferrydriver.Settler, group string, ids []uuid.UUID, timeout time.Duration, hooks ...ferryhook.Hook) (*Settlement, error) {
	if group == "" {
		return nil, errors.New("ferry: AwaitSettled needs the consumer group")
	}
	var ends []func(*Settlement, error)
	for _, sh := range ferryhook.Of[SettleHook](hooks) {
		var end func(*Settlement, error)
		ctx, end = sh.OnSettleStart(ctx, group, ids)
		ends = append(ends, end)
	}
	start := time.Now()
	out, err := awaitSettled(ctx, s, group, ids, start.Add(timeout))
	if err == nil {
		newCallMetrics(hooks).settleWait.Observe(time.Since(start).Seconds(), out.Outcome())
	}
	for _, end := range ends {
		end(out, err)
	}
	return out, err
}

func awaitSettled(ctx context.Context, s ferrydriver.Settler, group string, ids []uuid.UUID, deadline time.Time) (*Settlement, error) {
	rows, err := s.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: group, EventIDs: ids, Deadline: deadline})
	if err != nil {
		return nil, err
	}
	return settlementOf(ids, rows), nil
}

// SettleHook observes AwaitSettled calls (its trailing hooks).
type SettleHook interface {
	// OnSettleStart is called when an AwaitSettled call starts waiting
	// for ids of group. The context it returns is the one the wait runs
	// in (a tracing hook puts the call's span there); end is called once,
	// when AwaitSettled returns, with what it returns.
	OnSettleStart(ctx context.Context, group string, ids []uuid.UUID) (_ context.Context, end func(st *Settlement, err error))
}

// Failed returns, for the events of ids that group gave up on, the reason.
// It is the cheap predicate for a gate: ask "did it fail?", not "is it
// done?" (right after the producer's commit the answer to that is no).
func Failed(ctx context.Context, s ferrydriver.Settler, group string, ids ...uuid.UUID) (map[uuid.UUID]string, error) {
	rows, err := s.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: group, EventIDs: ids})
	if err != nil {
		return nil, err
	}
	return settlementOf(ids, rows).Failed, nil
}

func settlementOf(ids []uuid.UUID, rows map[uuid.UUID]*ferrydriver.InboxRow) *Settlement {
	out := &Settlement{Failed: map[uuid.UUID]string{}}
	for _, id := range ids {
		row := rows[id]
		switch {
		case row == nil || !row.State.Finished():
			out.Pending = append(out.Pending, id)
		case row.State == ferrydriver.InboxProcessed:
			out.Settled = append(out.Settled, id)
		default:
			reason := row.LastError
			if reason == "" {
				reason = string(row.State)
			}
			out.Failed[id] = reason
		}
	}
	return out
}
