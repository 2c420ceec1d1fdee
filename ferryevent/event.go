// Package ferryevent defines the event record that every part of Ferry shares:
// producers build it, drivers store it, sinks publish it and consumers decode it.
//
// Applications normally use it through the alias ferry.Event. The package has
// no dependencies beyond the standard library and a UUID generator so that
// drivers and sinks can import it without pulling in anything else.
//
// Stability: the field set is part of Ferry's public contract.
package ferryevent

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// DefaultMaxPayloadBytes is the payload limit applied when a configuration
// leaves it at zero: 1 MiB, the default max_payload of a NATS server.
const DefaultMaxPayloadBytes = 1 << 20

// Event is one fact a service wants the rest of the system to know about.
//
// Topic, Key and Type are required. ID and CreatedAt are filled in by
// Ferry when left empty, before the event is written, so that the same
// event keeps the same ID if the caller's transaction is retried with the
// same value.
type Event struct {
	// ID identifies the event everywhere: the outbox row, the broker's
	// deduplication header (Nats-Msg-Id), the CloudEvents "id" attribute
	// and the consumer inbox. A UUIDv7 is minted by NewID when empty.
	ID uuid.UUID
	// Topic routes the event; sinks map it to a subject, topic or routing key.
	Topic string
	// Key orders the event: events with the same key are delivered in the
	// commit order of the transactions that emitted them. Usually the ID of
	// the aggregate the event is about (an order ID, a customer ID).
	Key string
	// Type names what happened, for example "OrderCreated".
	Type string
	// Source names the producer (a service or aggregate type); it becomes the
	// CloudEvents "source" attribute. Optional.
	Source string
	// Headers are string attributes carried to the broker as message headers:
	// trace context, correlation IDs. Optional.
	Headers map[string]string
	// ContentType is the media type of Payload, for example
	// "application/json". Optional.
	ContentType string
	// Payload is the event body, stored and published as is.
	Payload []byte
	// CreatedAt is when the event was created. Set to the current time when zero.
	CreatedAt time.Time

	// Seq is the event's position among the events of its Key: 1 for the
	// key's first event, then one more for each committed event (a
	// rolled-back append uses no number). It is assigned by the outbox
	// when the event is written; producers leave it zero.
	//
	// The outbox does not remember a key forever: once a key has had no
	// new event for the relay's KeyRetention (by default its Retention,
	// 24 h) and every feed has delivered all its events, the relay forgets
	// it, and the key's next event has Seq 1 again. It is still delivered
	// after every earlier event of the key. So Seq is gapless within a run
	// of a key's events, not over its whole life: use it to check order
	// and gaps between events that are close in time, never as a lifetime
	// counter or to deduplicate (a consumer that skips events whose Seq is
	// at most the last one it applied would drop a restarted key's
	// events; deduplicate by ID, as the inbox does). A relay with a
	// negative KeyRetention never forgets a key. A redriven dead letter is
	// appended again as a new event of its key: same ID, a new Seq.
	Seq int64
}

// NewID mints a new event ID: a UUIDv7, time-ordered and random in its low bits.
func NewID() uuid.UUID {
	id, err := uuid.NewV7()
	if err != nil {
		// uuid.NewV7 only fails when the system's random source fails, in
		// which case nothing else in the process can work either.
		panic(fmt.Sprintf("ferryevent: mint UUIDv7: %v", err))
	}
	return id
}

// Errors returned by Validate. They are wrapped in a *ValidationError that
// says which event was wrong; test for them with errors.Is.
var (
	ErrEmptyTopic    = errors.New("event topic is empty")
	ErrEmptyKey      = errors.New("event key is empty")
	ErrEmptyType     = errors.New("event type is empty")
	ErrEventTooLarge = errors.New("event payload is larger than the configured limit")
	ErrInvalidText   = errors.New("event text field is not valid UTF-8 or contains a NUL byte")
)

// ValidationError tells which event failed validation and why.
type ValidationError struct {
	// Index is the event's position in the call that was rejected.
	Index int
	// ID is the event's ID, if it had one.
	ID uuid.UUID
	// Field names the offending field.
	Field string
	// Err is one of the ErrXxx sentinels of this package.
	Err error
	// Detail adds figures, such as the size and the limit.
	Detail string
}

func (e *ValidationError) Error() string {
	msg := fmt.Sprintf("event %d", e.Index)
	if e.ID != uuid.Nil {
		msg += " (" + e.ID.String() + ")"
	}
	msg += ": " + e.Field + ": " + e.Err.Error()
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

func (e *ValidationError) Unwrap() error { return e.Err }

// Prepare validates ev (see Validate) and fills in ID and CreatedAt when
// they are empty.
func Prepare(ev *Event, index int, maxPayload int, now time.Time) error {
	if err := Validate(ev, index, maxPayload); err != nil {
		return err
	}
	if ev.ID == uuid.Nil {
		ev.ID = NewID()
	}
	if ev.CreatedAt.IsZero() {
		ev.CreatedAt = now
	}
	return nil
}

// Validate checks that ev has a Topic, Key and Type, that its text fields
// are valid UTF-8 without NUL bytes, and that its payload is at most
// maxPayload bytes (DefaultMaxPayloadBytes when <= 0). index is reported in
// the error.
func Validate(ev *Event, index int, maxPayload int) error {
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayloadBytes
	}
	fail := func(field string, err error, detail string) error {
		return &ValidationError{Index: index, ID: ev.ID, Field: field, Err: err, Detail: detail}
	}
	switch {
	case strings.TrimSpace(ev.Topic) == "":
		return fail("Topic", ErrEmptyTopic, "set Topic to the stream of events this belongs to, e.g. \"orders\"")
	case strings.TrimSpace(ev.Key) == "":
		return fail("Key", ErrEmptyKey, "set Key to the ID of the entity the event is about; events of one key stay in order")
	case strings.TrimSpace(ev.Type) == "":
		return fail("Type", ErrEmptyType, "set Type to what happened, e.g. \"OrderCreated\"")
	case len(ev.Payload) > maxPayload:
		return fail("Payload", ErrEventTooLarge, fmt.Sprintf("%d bytes, limit %d; store large blobs elsewhere and send a reference, or raise MaxPayloadBytes (and the broker's limit)", len(ev.Payload), maxPayload))
	}
	for name, v := range map[string]string{"Topic": ev.Topic, "Key": ev.Key, "Type": ev.Type, "Source": ev.Source, "ContentType": ev.ContentType} {
		if !validText(v) {
			return fail(name, ErrInvalidText, "")
		}
	}
	for k, v := range ev.Headers {
		if !validText(k) || !validText(v) || k == "" {
			return fail("Headers", ErrInvalidText, fmt.Sprintf("header %q", k))
		}
	}
	return nil
}

func validText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}
