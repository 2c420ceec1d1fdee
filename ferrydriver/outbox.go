package ferrydriver

import (
	"context"

	"github.com/ferry-dev/ferry/ferryevent"
)

// OutboxReader is implemented by drivers whose outbox can be read as a
// transaction sees it. It serves tests of what an application emitted
// (package ferrytest), not the relay: the outbox keeps an event only until
// retention deletes it after delivery (ferry.RelayConfig.Retention).
// PostgreSQL, MariaDB and SQLite implement it.
type OutboxReader[TTx any] interface {
	// OutboxEventsTx returns the outbox's events that tx sees, its own
	// uncommitted ones among them, oldest first.
	OutboxEventsTx(ctx context.Context, tx TTx, p *OutboxEventsParams) ([]*ferryevent.Event, error)
	// OutboxEvents returns the outbox's committed events, oldest first.
	OutboxEvents(ctx context.Context, p *OutboxEventsParams) ([]*ferryevent.Event, error)
}

// OutboxEventsParams select events of the outbox; an empty field matches
// every value.
type OutboxEventsParams struct {
	Topic, Key, Type string
	// Limit is the most events returned; default 1,000.
	Limit int
}

// outboxEventsLimit is OutboxEventsParams.Limit's default.
const outboxEventsLimit = 1000

// WithDefaults returns p with Limit set (nil: every event, up to the
// default limit).
func (p *OutboxEventsParams) WithDefaults() OutboxEventsParams {
	var c OutboxEventsParams
	if p != nil {
		c = *p
	}
	if c.Limit <= 0 {
		c.Limit = outboxEventsLimit
	}
	return c
}
