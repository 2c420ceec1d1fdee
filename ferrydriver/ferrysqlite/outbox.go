package ferrysqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

var _ ferrydriver.OutboxReader[*sql.Tx] = (*Driver)(nil)

// sqlOutboxEvents lists outbox events for ferrydriver.OutboxReader (tests
// of what an application emitted), in id order.
const sqlOutboxEvents = `
SELECT event_id, topic, key, seq, type, source, content_type, headers, payload, created_at
  FROM ferry_outbox
 WHERE (?1 = '' OR topic = ?1) AND (?2 = '' OR key = ?2) AND (?3 = '' OR type = ?3)
 ORDER BY id LIMIT ?4`

// OutboxEventsTx implements ferrydriver.OutboxReader: the events tx sees.
func (d *Driver) OutboxEventsTx(ctx context.Context, tx *sql.Tx, p *ferrydriver.OutboxEventsParams) ([]*ferryevent.Event, error) {
	return d.outboxEvents(ctx, tx, p)
}

// OutboxEvents implements ferrydriver.OutboxReader: the committed events,
// read on the driver's reading connections (never waiting for the writer).
func (d *Driver) OutboxEvents(ctx context.Context, p *ferrydriver.OutboxEventsParams) ([]*ferryevent.Event, error) {
	return d.outboxEvents(ctx, d.r, p)
}

func (d *Driver) outboxEvents(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, p *ferrydriver.OutboxEventsParams) ([]*ferryevent.Event, error) {
	c := p.WithDefaults()
	rows, err := q.QueryContext(ctx, sqlOutboxEvents, c.Topic, c.Key, c.Type, c.Limit)
	if err != nil {
		return nil, d.wrapErr("read the outbox", err)
	}
	defer rows.Close()
	var out []*ferryevent.Event
	for rows.Next() {
		ev := &ferryevent.Event{}
		var eventID string
		var headers sql.NullString
		var created int64
		if err := rows.Scan(&eventID, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created); err != nil {
			return nil, d.wrapErr("read the outbox", err)
		}
		ev.CreatedAt = fromMicros(created)
		if err := ev.ID.UnmarshalText([]byte(eventID)); err != nil {
			return nil, fmt.Errorf("ferrysqlite: outbox row with event id %q: %w", eventID, err)
		}
		if err := decodeHeaders(ev, headers); err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("read the outbox", err)
	}
	return out, nil
}
