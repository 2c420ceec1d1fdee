package ferryevent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func valid() *Event {
	return &Event{Topic: "orders", Key: "order-1", Type: "OrderPlaced", Payload: []byte("{}")}
}

func TestPrepareFillsIDAndTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ev := valid()
	require.NoError(t, Prepare(ev, 0, 0, now))
	require.NotEqual(t, uuid.Nil, ev.ID)
	require.Equal(t, uuid.Version(7), ev.ID.Version())
	require.Equal(t, now, ev.CreatedAt)

	id, at := ev.ID, ev.CreatedAt
	require.NoError(t, Prepare(ev, 0, 0, now.Add(time.Hour)))
	require.Equal(t, id, ev.ID, "an existing ID is kept, so retries emit the same event")
	require.Equal(t, at, ev.CreatedAt)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		edit  func(*Event)
		max   int
		want  error
		field string
	}{
		{"empty topic", func(e *Event) { e.Topic = " " }, 0, ErrEmptyTopic, "Topic"},
		{"empty key", func(e *Event) { e.Key = "" }, 0, ErrEmptyKey, "Key"},
		{"empty type", func(e *Event) { e.Type = "" }, 0, ErrEmptyType, "Type"},
		{"too large", func(e *Event) { e.Payload = make([]byte, 1001-EnvelopeBytes(e)) }, 1000, ErrEventTooLarge, "Payload"},
		{"too large default", func(e *Event) { e.Payload = make([]byte, DefaultMaxPayloadBytes+1) }, 0, ErrEventTooLarge, "Payload"},
		{"NUL in key", func(e *Event) { e.Key = "a\x00b" }, 0, ErrInvalidText, "Key"},
		{"bad UTF-8 type", func(e *Event) { e.Type = "\xff" }, 0, ErrInvalidText, "Type"},
		{"empty header name", func(e *Event) { e.Headers = map[string]string{"": "x"} }, 0, ErrInvalidHeaderName, "Headers"},
		{"LF in key", func(e *Event) { e.Key = "k\nnl" }, 0, ErrInvalidText, "Key"},
		{"tab in type", func(e *Event) { e.Type = "a\tb" }, 0, ErrInvalidText, "Type"},
		{"C1 control in source", func(e *Event) { e.Source = "a\u0085b" }, 0, ErrInvalidText, "Source"},
		{"DEL in content type", func(e *Event) { e.ContentType = "text/plain\x7f" }, 0, ErrInvalidText, "ContentType"},
		{"spaces around key", func(e *Event) { e.Key = "  k-sp  " }, 0, ErrSurroundingSpace, "Key"},
		{"no-break space ending type", func(e *Event) { e.Type = "T\u00a0" }, 0, ErrSurroundingSpace, "Type"},
		{"key too long", func(e *Event) { e.Key = strings.Repeat("k", MaxKeyBytes+1) }, 0, ErrFieldTooLong, "Key"},
		{"type too long", func(e *Event) { e.Type = strings.Repeat("t", MaxTypeBytes+1) }, 0, ErrFieldTooLong, "Type"},
		{"content type too long", func(e *Event) { e.ContentType = strings.Repeat("c", MaxContentTypeBytes+1) }, 0, ErrFieldTooLong, "ContentType"},
		{"topic with a space", func(e *Event) { e.Topic = "a b" }, 0, ErrInvalidTopic, "Topic"},
		{"wildcard topic", func(e *Event) { e.Topic = ">" }, 0, ErrInvalidTopic, "Topic"},
		{"topic with a star word", func(e *Event) { e.Topic = "orders.*" }, 0, ErrInvalidTopic, "Topic"},
		{"topic ending in a dot", func(e *Event) { e.Topic = "orders." }, 0, ErrInvalidTopic, "Topic"},
		{"topic with an empty word", func(e *Event) { e.Topic = "a..b" }, 0, ErrInvalidTopic, "Topic"},
		{"non-ASCII topic", func(e *Event) { e.Topic = "zamówienia" }, 0, ErrInvalidTopic, "Topic"},
		{"topic too long", func(e *Event) { e.Topic = strings.Repeat("t", MaxTopicBytes+1) }, 0, ErrFieldTooLong, "Topic"},
		{"non-ASCII header name", func(e *Event) { e.Headers = map[string]string{"naïve": "x"} }, 0, ErrInvalidHeaderName, "Headers"},
		{"header name with a space", func(e *Event) { e.Headers = map[string]string{"X Bad": "x"} }, 0, ErrInvalidHeaderName, "Headers"},
		{"header name with a colon", func(e *Event) { e.Headers = map[string]string{"a:b": "x"} }, 0, ErrInvalidHeaderName, "Headers"},
		{"header names differing in case", func(e *Event) { e.Headers = map[string]string{"X-A": "1", "x-a": "2"} }, 0, ErrInvalidHeaderName, "Headers"},
		{"header name too long", func(e *Event) { e.Headers = map[string]string{strings.Repeat("h", MaxHeaderNameBytes+1): "x"} }, 0, ErrInvalidHeaderName, "Headers"},
		{"ce-id header", func(e *Event) { e.Headers = map[string]string{"ce-id": "x"} }, 0, ErrReservedHeader, "Headers"},
		{"Kafka ce_ header", func(e *Event) { e.Headers = map[string]string{"ce_type": "x"} }, 0, ErrReservedHeader, "Headers"},
		{"AMQP cloudEvents_ header", func(e *Event) { e.Headers = map[string]string{"cloudEvents_source": "x"} }, 0, ErrReservedHeader, "Headers"},
		{"Nats- header", func(e *Event) { e.Headers = map[string]string{"Nats-Msg-Id": "x"} }, 0, ErrReservedHeader, "Headers"},
		{"Content-Type header", func(e *Event) { e.Headers = map[string]string{"content-type": "x"} }, 0, ErrReservedHeader, "Headers"},
		{"BCC header", func(e *Event) { e.Headers = map[string]string{"BCC": "q"} }, 0, ErrReservedHeader, "Headers"},
		{"x-death header", func(e *Event) { e.Headers = map[string]string{"X-Death": "q"} }, 0, ErrReservedHeader, "Headers"},
		{"HTTP Host header", func(e *Event) { e.Headers = map[string]string{"Host": "h"} }, 0, ErrReservedHeader, "Headers"},
		{"CRLF in a header value", func(e *Event) { e.Headers = map[string]string{"x-a": "a\r\nb"} }, 0, ErrInvalidText, "Headers"},
		{"header value with a trailing space", func(e *Event) { e.Headers = map[string]string{"x-a": "v "} }, 0, ErrSurroundingSpace, "Headers"},
		{"header value too long", func(e *Event) { e.Headers = map[string]string{"x-a": strings.Repeat("v", MaxHeaderValueBytes+1)} }, 0, ErrFieldTooLong, "Headers"},
		{"headers too large together", func(e *Event) {
			e.Headers = map[string]string{}
			for i := range 5 {
				e.Headers["x-"+string(rune('a'+i))] = strings.Repeat("v", MaxHeaderValueBytes)
			}
		}, 1 << 30, ErrFieldTooLong, "Headers"},
		{"year 10000", func(e *Event) { e.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, 0, ErrInvalidTime, "CreatedAt"},
		{"payload at the limit without room for the envelope", func(e *Event) { e.Payload = make([]byte, DefaultMaxPayloadBytes) }, 0, ErrEventTooLarge, "Payload"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := valid()
			tc.edit(ev)
			err := Validate(ev, 3, tc.max)
			require.ErrorIs(t, err, tc.want)
			var ve *ValidationError
			require.True(t, errors.As(err, &ve))
			require.Equal(t, 3, ve.Index)
			require.Equal(t, tc.field, ve.Field)
			require.True(t, strings.HasPrefix(err.Error(), "event 3"), err.Error())
		})
	}
	ev := valid()
	ev.Payload = make([]byte, 1000-EnvelopeBytes(ev))
	require.NoError(t, Validate(ev, 0, 1000), "an event at the limit is accepted")

	for _, edit := range []func(*Event){
		func(e *Event) { e.Key = "customer 7/ü:€ \"quoted\"" },
		func(e *Event) { e.Key = strings.Repeat("k", MaxKeyBytes) },
		func(e *Event) { e.Key = "\u200bzero-width, not white space" },
		func(e *Event) { e.Topic = "billing.invoice-paid.v2_1" },
		func(e *Event) { e.Topic = strings.Repeat("t", MaxTopicBytes) },
		func(e *Event) {
			e.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "X-Empty": ""}
		},
		func(e *Event) { e.Headers = map[string]string{"x-u": "ünïcode ✓ a  b\u200b"} },
		func(e *Event) {
			e.Headers = map[string]string{"User-Agent": "mine", "X-Request-Id": "r1", "cc-list": "a"}
		},
		func(e *Event) { e.Payload = []byte("\x00\r\n\xff") },
		func(e *Event) { e.CreatedAt = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC) },
	} {
		ev := valid()
		edit(ev)
		require.NoError(t, Validate(ev, 0, 0), "%+v", ev)
	}
}

func TestPrepareNormalizesWhatStoresKeep(t *testing.T) {
	t.Parallel()
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	ev := valid()
	ev.CreatedAt = time.Date(2026, 1, 2, 3, 4, 5, 123456789, zone)
	require.NoError(t, Prepare(ev, 0, 0, time.Now()))
	require.Equal(t, time.Date(2026, 1, 1, 21, 34, 5, 123456000, time.UTC), ev.CreatedAt, "UTC, to the microsecond")
	require.Equal(t, time.UTC, ev.CreatedAt.Location())
	require.Equal(t, DefaultSource, ev.Source, "an empty Source reads back as the CloudEvents default, so it is set at emit")
}

func TestCheckRelayableIsLooserThanValidate(t *testing.T) {
	t.Parallel()
	ev := valid()
	ev.Key, ev.Topic = " old key ", "a b"
	require.Error(t, Validate(ev, 0, 0))
	require.NoError(t, CheckRelayable(ev), "an event stored under an earlier version's rules is still relayed")
	ev.Key = "a\x00b"
	require.ErrorIs(t, CheckRelayable(ev), ErrInvalidText)
	ev.Key = ""
	require.ErrorIs(t, CheckRelayable(ev), ErrEmptyKey)
}

func TestEnvelopeBytesBoundsTheNATSHeaderBlock(t *testing.T) {
	t.Parallel()
	ev := valid()
	ev.ContentType = "application/json"
	ev.Headers = map[string]string{"traceparent": strings.Repeat("a", 55)}
	require.NoError(t, Prepare(ev, 0, 0, time.Now()))
	ev.Seq = 1<<63 - 1
	n := len("NATS/1.0\r\n\r\n")
	for name, value := range ev.CloudEventAttributes() {
		n += len("ce-") + len(name) + len(": \r\n") + len(value)
	}
	for name, value := range ev.Headers {
		n += len(name) + len(": \r\n") + len(value)
	}
	n += len("Content-Type: \r\n") + len(ev.ContentType) + len("Nats-Msg-Id: \r\n") + 36
	require.GreaterOrEqual(t, EnvelopeBytes(ev), n+len(ev.Key), "the envelope must cover the attributes, the headers and Kafka's record key")
}

func TestCloudEventAttributes(t *testing.T) {
	t.Parallel()
	ev := valid()
	require.NoError(t, Prepare(ev, 0, 0, time.Date(2026, 2, 3, 4, 5, 6, 7000, time.FixedZone("x", 3600))))
	ev.Seq = 9
	a := ev.CloudEventAttributes()
	require.Equal(t, "1.0", a[CESpecVersion])
	require.Equal(t, ev.ID.String(), a[CEID])
	require.Equal(t, DefaultSource, a[CESource], "source is required by CloudEvents")
	require.Equal(t, "OrderPlaced", a[CEType])
	require.Equal(t, "order-1", a[CESubject])
	require.Equal(t, "2026-02-03T03:05:06.000007Z", a[CETime])
	require.Equal(t, "9", a[CEKeySeq])
	require.Equal(t, "orders", a[CETopic])
	_, hasCT := a[CEDataContentType]
	require.False(t, hasCT)
	ev.Source, ev.ContentType = "shop", "application/json"
	a = ev.CloudEventAttributes()
	require.Equal(t, "shop", a[CESource])
	require.Equal(t, "application/json", a[CEDataContentType])
}

func TestIsToken(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"traceparent": true, "X-Tenant": true, "a.b_c~d|e^f`g!#$%&'*+": true,
		"": false, "x tenant": false, "x:y": false, "ü": false, "a\tb": false, `"q"`: false, "a,b": false,
	} {
		require.Equal(t, want, IsToken(s), "%q", s)
	}
	require.True(t, ValidHeaderName(strings.Repeat("h", MaxHeaderNameBytes)))
	require.False(t, ValidHeaderName(strings.Repeat("h", MaxHeaderNameBytes+1)), "a token, but too long")
}
