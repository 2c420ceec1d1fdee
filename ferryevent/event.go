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

// DefaultMaxPayloadBytes is the size limit applied when a configuration
// leaves it at zero: 1 MiB, the default max_payload of a NATS server and,
// near enough, Kafka's default max.message.bytes. It bounds the payload
// plus the envelope every sink adds (EnvelopeBytes), since brokers count
// both.
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
	// CloudEvents "source" attribute. Optional: Prepare sets it to
	// DefaultSource when empty, since CloudEvents requires the attribute.
	Source string
	// Headers are string attributes carried to the broker as message headers:
	// trace context, correlation IDs. Optional.
	Headers map[string]string
	// ContentType is the media type of Payload, for example
	// "application/json". Optional.
	ContentType string
	// Payload is the event body, stored and published as is.
	Payload []byte
	// CreatedAt is when the event was created. Set to the current time when
	// zero. Prepare keeps it in UTC to the microsecond, what every outbox
	// store keeps, so that the value Emit leaves in the event is the one
	// every sink and consumer reads.
	CreatedAt time.Time

	// Seq is the event's position among the events of its Key: 1 for the
	// key's first event, then one more for each committed event (a
	// rolled-back append uses no number), in the key's commit order.
	// Producers leave it zero. On PostgreSQL the relay assigns it as it
	// reads the key's events, per feed, and saves it with its checkpoint,
	// so an event delivered again carries the same Seq; on MariaDB, SQLite
	// and MongoDB the outbox assigns it when the event is written. Either
	// way it is not known when Emit returns.
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
	// published again as it was: the same ID and Seq, after later events
	// of its key, by the one feed that dead-lettered it.
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
// says which event and field were wrong; test for them with errors.Is.
var (
	ErrEmptyTopic    = errors.New("event topic is empty")
	ErrEmptyKey      = errors.New("event key is empty")
	ErrEmptyType     = errors.New("event type is empty")
	ErrEventTooLarge = errors.New("event payload and envelope are larger than the configured limit")
	// ErrInvalidText: a text field is not valid UTF-8, or holds a control
	// character (NUL, tab, CR, LF, DEL, U+0080-U+009F), which some broker
	// or HTTP hop would drop or replace.
	ErrInvalidText = errors.New("event text is not valid UTF-8 or holds a control character")
	// ErrSurroundingSpace: a text field starts or ends with white space,
	// which message headers trim on the way.
	ErrSurroundingSpace = errors.New("event text starts or ends with white space")
	// ErrFieldTooLong: a field is longer than its limit (MaxKeyBytes, ...).
	ErrFieldTooLong = errors.New("event field is longer than its limit")
	// ErrInvalidTopic: the topic does not follow the grammar every sink can
	// carry (see ValidTopic).
	ErrInvalidTopic = errors.New("event topic is not dot-separated words of ASCII letters, digits, '-' and '_'")
	// ErrInvalidHeaderName: a header name is not an HTTP token, or two
	// names differ only in case.
	ErrInvalidHeaderName = errors.New("event header name cannot be carried by every sink")
	// ErrReservedHeader: a header name belongs to Ferry, CloudEvents, a
	// broker or HTTP (see ReservedHeader).
	ErrReservedHeader = errors.New("event header name is reserved")
	// ErrInvalidTime: CreatedAt is outside the years 0001-9999 (UTC), which
	// RFC 3339 times cannot write.
	ErrInvalidTime = errors.New("event time is outside the years 0001-9999")
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

// Prepare validates ev (see Validate) and completes it the way every store
// and sink will read it back: ID and CreatedAt are filled in when empty,
// CreatedAt is put in UTC and truncated to the microsecond, and an empty
// Source becomes DefaultSource.
func Prepare(ev *Event, index int, maxPayload int, now time.Time) error {
	if ev.CreatedAt.IsZero() {
		ev.CreatedAt = now
	}
	ev.CreatedAt = ev.CreatedAt.UTC().Truncate(time.Microsecond)
	if ev.Source == "" {
		ev.Source = DefaultSource
	}
	if err := Validate(ev, index, maxPayload); err != nil {
		return err
	}
	if ev.ID == uuid.Nil {
		ev.ID = NewID()
	}
	return nil
}

// Validate checks the rule Ferry keeps for every event it accepts: each
// field reaches every sink and every consumer byte for byte, or the event
// is refused here. index is reported in the error; maxPayload bounds
// len(Payload) + EnvelopeBytes(ev) (DefaultMaxPayloadBytes when <= 0).
//
//   - Topic, Key and Type are required; Topic follows ValidTopic.
//   - Key, Type, Source, ContentType and header values are valid UTF-8
//     without control characters, with no white space at either end, and
//     within MaxKeyBytes, MaxTypeBytes, MaxSourceBytes,
//     MaxContentTypeBytes and MaxHeaderValueBytes.
//   - Header names are HTTP tokens of at most MaxHeaderNameBytes, no two
//     differing only in case, none reserved (ReservedHeader); names and
//     values together take at most MaxHeadersBytes.
//   - CreatedAt, when set, lies in the years 0001-9999.
//
// The payload is bytes and any value passes, empty included.
func Validate(ev *Event, index int, maxPayload int) error {
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayloadBytes
	}
	fail := func(field string, err error, detail string) error {
		return &ValidationError{Index: index, ID: ev.ID, Field: field, Err: err, Detail: detail}
	}
	if field, err := missingField(ev); err != nil {
		return fail(field, err, missingHow[field])
	}
	if err := checkTopic(ev.Topic); err != nil {
		return fail("Topic", err, fmt.Sprintf("%.80q: use words of ASCII letters, digits, '-' and '_' joined by single dots (\"orders\", \"billing.invoice-paid\"), at most %d bytes", ev.Topic, MaxTopicBytes))
	}
	for _, f := range []struct {
		name  string
		value string
		limit int
	}{
		{"Key", ev.Key, MaxKeyBytes},
		{"Type", ev.Type, MaxTypeBytes},
		{"Source", ev.Source, MaxSourceBytes},
		{"ContentType", ev.ContentType, MaxContentTypeBytes},
	} {
		if detail, err := checkText(f.value, f.limit); err != nil {
			return fail(f.name, err, detail)
		}
	}
	if detail, err := checkHeaders(ev.Headers); err != nil {
		return fail("Headers", err, detail)
	}
	if !ev.CreatedAt.IsZero() {
		if y := ev.CreatedAt.UTC().Year(); y < 1 || y > 9999 {
			return fail("CreatedAt", ErrInvalidTime, fmt.Sprintf("year %d", y))
		}
	}
	if n := len(ev.Payload) + EnvelopeBytes(ev); n > maxPayload {
		return fail("Payload", ErrEventTooLarge, fmt.Sprintf("%d bytes of payload and %d of envelope (attributes and headers, which brokers count too), limit %d; store large blobs elsewhere and send a reference, or raise MaxPayloadBytes (and the broker's limit)", len(ev.Payload), n-len(ev.Payload), maxPayload))
	}
	return nil
}

// missingField names the first of Topic, Key and Type that is empty or
// blank, with its sentinel.
func missingField(ev *Event) (string, error) {
	switch {
	case strings.TrimSpace(ev.Topic) == "":
		return "Topic", ErrEmptyTopic
	case strings.TrimSpace(ev.Key) == "":
		return "Key", ErrEmptyKey
	case strings.TrimSpace(ev.Type) == "":
		return "Type", ErrEmptyType
	}
	return "", nil
}

// missingHow says what to set for each field missingField names.
var missingHow = map[string]string{
	"Topic": "set Topic to the stream of events this belongs to, e.g. \"orders\"",
	"Key":   "set Key to the ID of the entity the event is about; events of one key stay in order",
	"Type":  "set Type to what happened, e.g. \"OrderCreated\"",
}

// CheckRelayable checks what the relay needs of an event read back from an
// outbox: a Topic, Key and Type, and text fields of valid UTF-8 without NUL
// bytes. It is looser than Validate on purpose: an event accepted by an
// earlier version of Ferry, under looser rules, is still relayed (a sink
// that cannot carry it dead-letters it with the reason) rather than
// dead-lettered at the feed.
func CheckRelayable(ev *Event) error {
	fail := func(field string, err error, detail string) error {
		return &ValidationError{ID: ev.ID, Field: field, Err: err, Detail: detail}
	}
	if field, err := missingField(ev); err != nil {
		return fail(field, err, "")
	}
	for name, v := range map[string]string{"Topic": ev.Topic, "Key": ev.Key, "Type": ev.Type, "Source": ev.Source, "ContentType": ev.ContentType} {
		if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return fail(name, ErrInvalidText, "")
		}
	}
	for k, v := range ev.Headers {
		if k == "" || !utf8.ValidString(k) || !utf8.ValidString(v) || strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0) {
			return fail("Headers", ErrInvalidText, fmt.Sprintf("header %q", k))
		}
	}
	return nil
}
