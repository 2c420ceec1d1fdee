package ferrymysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

var _ ferrydriver.OutboxReader[*sql.Tx] = (*Driver)(nil)

// sqlOutboxEvents lists outbox events for ferrydriver.OutboxReader (tests
// of what an application emitted), in id order: topic, key, type (” any)
// and the limit.
const sqlOutboxEvents = `SELECT ` + outboxSelect + ` FROM ferry_outbox
WHERE (? = '' OR topic = ?) AND (? = '' OR k = ?) AND (? = '' OR type = ?)
ORDER BY id LIMIT ?`

// OutboxEventsTx implements ferrydriver.OutboxReader: the events tx sees.
func (d *Driver) OutboxEventsTx(ctx context.Context, tx *sql.Tx, p *ferrydriver.OutboxEventsParams) ([]*ferryevent.Event, error) {
	return d.outboxEvents(ctx, tx, p)
}

// OutboxEvents implements ferrydriver.OutboxReader: the committed events.
func (d *Driver) OutboxEvents(ctx context.Context, p *ferrydriver.OutboxEventsParams) ([]*ferryevent.Event, error) {
	return d.outboxEvents(ctx, d.db, p)
}

func (d *Driver) outboxEvents(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, p *ferrydriver.OutboxEventsParams) ([]*ferryevent.Event, error) {
	c := p.WithDefaults()
	rows, err := q.QueryContext(ctx, sqlOutboxEvents, c.Topic, c.Topic, c.Key, c.Key, c.Type, c.Type, c.Limit)
	if err != nil {
		return nil, d.wrapErr("read the outbox", err)
	}
	defer rows.Close()
	var out []*ferryevent.Event
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, d.wrapErr("read the outbox", err)
		}
		if r.invalid != "" {
			return nil, errors.New("ferrymysql: " + r.invalid)
		}
		out = append(out, r.ev)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("read the outbox", err)
	}
	return out, nil
}
