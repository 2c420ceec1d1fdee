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
		{"too large", func(e *Event) { e.Payload = make([]byte, 11) }, 10, ErrEventTooLarge, "Payload"},
		{"too large default", func(e *Event) { e.Payload = make([]byte, DefaultMaxPayloadBytes+1) }, 0, ErrEventTooLarge, "Payload"},
		{"NUL in key", func(e *Event) { e.Key = "a\x00b" }, 0, ErrInvalidText, "Key"},
		{"bad UTF-8 type", func(e *Event) { e.Type = "\xff" }, 0, ErrInvalidText, "Type"},
		{"empty header name", func(e *Event) { e.Headers = map[string]string{"": "x"} }, 0, ErrInvalidText, "Headers"},
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
	ev.Payload = make([]byte, 10)
	require.NoError(t, Validate(ev, 0, 10), "a payload at the limit is accepted")
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
