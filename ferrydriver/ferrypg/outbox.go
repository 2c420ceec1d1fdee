package ferrypg

import (
	"context"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

var _ ferrydriver.OutboxReader[any] = (*Driver[any])(nil)

// OutboxEventsTx implements ferrydriver.OutboxReader: the events tx sees.
func (d *Driver[TTx]) OutboxEventsTx(ctx context.Context, tx TTx, p *ferrydriver.OutboxEventsParams) ([]*ferryevent.Event, error) {
	return d.outboxEvents(ctx, d.wrapTx(tx), p)
}

// OutboxEvents implements ferrydriver.OutboxReader: the committed events.
func (d *Driver[TTx]) OutboxEvents(ctx context.Context, p *ferrydriver.OutboxEventsParams) ([]*ferryevent.Event, error) {
	return d.outboxEvents(ctx, d.db, p)
}

func (d *Driver[TTx]) outboxEvents(ctx context.Context, e executor, p *ferrydriver.OutboxEventsParams) ([]*ferryevent.Event, error) {
	c := p.WithDefaults()
	r, err := e.query(ctx, d.queries.outboxEvents, c.Topic, c.Key, c.Type, c.Limit)
	if err != nil {
		return nil, d.wrapErr("read the outbox", err)
	}
	defer r.Close()
	var out []*ferryevent.Event
	for r.Next() {
		ev := &ferryevent.Event{}
		var id int64
		var headers *string
		if err := r.Scan(&id, &ev.ID, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &ev.CreatedAt); err != nil {
			return nil, d.wrapErr("read the outbox", err)
		}
		if err := decodeHeaders(ev, headers); err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("read the outbox", err)
	}
	return out, nil
}
