package ferry

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/google/uuid"
)

// Event is one fact to publish. See ferryevent.Event for the fields.
type Event = ferryevent.Event

// NewID mints an event ID (a UUIDv7). Mint IDs before a transaction that may
// be retried, so the retried attempt emits the same event.
func NewID() uuid.UUID { return ferryevent.NewID() }

// Config configures a Client. The zero value (or nil) gives the defaults.
type Config struct {
	// MaxPayloadBytes rejects, at emit time, events whose payload plus
	// envelope (the attributes and headers a sink adds, which brokers
	// count: ferryevent.EnvelopeBytes) is larger. Default 1 MiB
	// (ferryevent.DefaultMaxPayloadBytes), NATS's default max_payload.
	// Keep it at or below the broker's limit.
	MaxPayloadBytes int
	// Logger receives the client's logs. Default: slog.Default().
	Logger *slog.Logger
	// Hooks observe the client (see Hook): each EmitHook sees every event
	// emitted, with the caller's context, before it is validated. A
	// tracing hook (ferryotel) writes the caller's trace context into the
	// event's headers there.
	Hooks []ferryhook.Hook
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *Config) WithDefaults() Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.MaxPayloadBytes == 0 {
		out.MaxPayloadBytes = ferryevent.DefaultMaxPayloadBytes
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *Config) validate() error {
	if c.MaxPayloadBytes < 0 {
		return fmt.Errorf("ferry: Config.MaxPayloadBytes is %d: use a positive size in bytes, or 0 for the 1 MiB default", c.MaxPayloadBytes)
	}
	return nil
}

// Client writes events to the outbox. TTx is the backend's transaction type:
// pgx.Tx or *sql.Tx for ferrypg.
type Client[TTx any] struct {
	driver ferrydriver.Driver[TTx]
	cfg    Config
	emit   []ferryhook.EmitHook
}

// NewClient returns a client writing through driver.
func NewClient[TTx any](driver ferrydriver.Driver[TTx], cfg *Config) (*Client[TTx], error) {
	if driver == nil {
		return nil, fmt.Errorf("ferry: NewClient needs a driver, for example ferrypg.New(pool, nil)")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Client[TTx]{driver: driver, cfg: c, emit: ferryhook.Of[ferryhook.EmitHook](c.Hooks)}, nil
}

// Driver returns the client's driver.
func (c *Client[TTx]) Driver() ferrydriver.Driver[TTx] { return c.driver }

// EmitTx writes events to the outbox inside tx. They are published if and
// only if tx commits: if the transaction rolls back, so do the events.
//
// Events are validated first (ferryevent.Validate): every field of an
// accepted event reaches every sink and consumer byte for byte, or the call
// is refused with a *ValidationError naming the event, the field and the
// rule, and nothing is written. Empty IDs, CreatedAt and Source are filled
// in, in place, and CreatedAt is put in UTC to the microsecond, so the
// event left in the slice is the one consumers read; inside RunTx, the
// n-th event emitted gets the same ID on every attempt.
// Events with the same Key are delivered in the commit order of the
// transactions that emitted them, and in slice order within one call.
//
// EmitTx locks each event's key until tx ends (that lock is what orders
// same-key producers). Emit once per transaction, as its last statement:
// the keys of one call are locked in key order, so such transactions never
// deadlock each other, and the locks are held for the shortest time. Two
// transactions that call EmitTx twice with the same keys in opposite
// orders can deadlock; PostgreSQL then aborts one of them, which RunTx
// runs again.
func (c *Client[TTx]) EmitTx(ctx context.Context, tx TTx, events ...*Event) error {
	if err := c.prepare(ctx, events); err != nil {
		return err
	}
	if err := c.driver.AppendTx(ctx, tx, events); err != nil {
		return fmt.Errorf("ferry: emit %d event(s): %w", len(events), err)
	}
	return nil
}

// Emit writes events in a transaction of their own. Use EmitTx to tie them
// to a business write.
func (c *Client[TTx]) Emit(ctx context.Context, events ...*Event) error {
	if err := c.prepare(ctx, events); err != nil {
		return err
	}
	if err := c.driver.Append(ctx, events); err != nil {
		return fmt.Errorf("ferry: emit %d event(s): %w", len(events), err)
	}
	return nil
}

func (c *Client[TTx]) prepare(ctx context.Context, events []*Event) error {
	now := time.Now()
	for i, ev := range events {
		if ev == nil {
			return fmt.Errorf("ferry: event %d is nil", i)
		}
		// Inside RunTx, the n-th event emitted takes the n-th ID of the
		// call, on every attempt; an event that has an ID keeps it (and
		// its slot), so that the others stay aligned.
		if id := nextEventID(ctx); ev.ID == uuid.Nil {
			ev.ID = id
		}
		for _, h := range c.emit {
			h.OnEmit(ctx, ev)
		}
		if err := ferryevent.Prepare(ev, i, c.cfg.MaxPayloadBytes, now); err != nil {
			return err
		}
	}
	return nil
}
