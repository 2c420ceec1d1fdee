package ferrynats

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

func wireEvent() *ferryevent.Event {
	return &ferryevent.Event{
		ID:          ferryevent.NewID(),
		Topic:       "orders",
		Key:         "order-42",
		Type:        "OrderPlaced",
		Source:      "shop",
		Headers:     map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		ContentType: "application/json",
		Payload:     []byte(`{"total":12}`),
		CreatedAt:   time.Date(2025, 1, 2, 3, 4, 5, 678901234, time.UTC),
		Seq:         7,
	}
}

func TestEncodeDecode(t *testing.T) {
	t.Parallel()
	ev := wireEvent()
	msg, err := encode(ev, "ferry.orders", "FERRY")
	require.NoError(t, err)
	require.Equal(t, ev.ID.String(), msg.Header.Get("Nats-Msg-Id"))
	require.Equal(t, "FERRY", msg.Header.Get("Nats-Expected-Stream"))
	require.Equal(t, "application/json", msg.Header.Get("Content-Type"))
	require.Equal(t, "2025-01-02T03:04:05.678901234Z", msg.Header.Get("ce-time"))
	require.Equal(t, "7", msg.Header.Get("ce-ferrykeyseq"))

	got, err := Decode(msg)
	require.NoError(t, err)
	require.Equal(t, *ev, got)
}

func TestDecodeMinimal(t *testing.T) {
	t.Parallel()
	ev := wireEvent()
	ev.Source, ev.Headers, ev.ContentType, ev.Payload, ev.Seq = "", nil, "", nil, 0
	msg, err := encode(ev, "ferry.orders", "")
	require.NoError(t, err)
	require.NotContains(t, msg.Header, "Nats-Expected-Stream")
	require.NotContains(t, msg.Header, "Content-Type")

	got, err := Decode(msg)
	require.NoError(t, err)
	ev.Source = ferryevent.DefaultSource
	require.Equal(t, *ev, got)
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		edit   func(h nats.Header)
		reason string
	}{
		{"not a CloudEvent", func(h nats.Header) { delete(h, "ce-specversion") }, "ce-specversion is missing"},
		{"other spec version", func(h nats.Header) { h.Set("ce-specversion", "0.3") }, `specversion "0.3"`},
		{"no id", func(h nats.Header) { delete(h, "ce-id") }, "ce-id is missing"},
		{"bad id", func(h nats.Header) { h.Set("ce-id", "42") }, "not a UUID"},
		{"nil id", func(h nats.Header) { h.Set("ce-id", "00000000-0000-0000-0000-000000000000") }, "nil UUID"},
		{"no type", func(h nats.Header) { h.Set("ce-type", " ") }, "ce-type is missing"},
		{"no key", func(h nats.Header) { delete(h, "ce-subject") }, "ce-subject is missing"},
		{"no topic", func(h nats.Header) { delete(h, "ce-ferrytopic") }, "ce-ferrytopic is missing"},
		{"no source", func(h nats.Header) { delete(h, "ce-source") }, "ce-source is missing"},
		{"bad time", func(h nats.Header) { h.Set("ce-time", "yesterday") }, "not an RFC 3339 time"},
		{"time out of range", func(h nats.Header) { h.Set("ce-time", "0000-01-01T00:00:00+01:00") }, "outside years"},
		{"bad seq", func(h nats.Header) { h.Set("ce-ferrykeyseq", "x") }, "not a positive integer"},
		{"zero seq", func(h nats.Header) { h.Set("ce-ferrykeyseq", "0") }, "not a positive integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			msg, err := encode(wireEvent(), "ferry.orders", "FERRY")
			require.NoError(t, err)
			tc.edit(msg.Header)
			_, err = Decode(msg)
			require.ErrorIs(t, err, ErrMalformed)
			require.ErrorContains(t, err, tc.reason)
		})
	}
	_, err := Decode(nil)
	require.ErrorIs(t, err, ErrMalformed)
}

func TestEncodeRefusesFerrysHeaderNames(t *testing.T) {
	t.Parallel()
	// Emit refuses these names; an event holding one all the same (an
	// outbox row of an earlier version) fails rather than losing it.
	for _, name := range []string{"NATS-MSG-ID", "nats-expected-stream", "Ce-Id", "CE-FERRYTOPIC", "CONTENT-TYPE"} {
		ev := wireEvent()
		ev.Headers = map[string]string{name: "x"}
		_, err := encode(ev, "ferry.orders", "FERRY")
		require.True(t, ferrysink.IsPermanent(err), "%s: %v", name, err)
		require.ErrorContains(t, err, strconv.Quote(name))
	}

	ev := wireEvent()
	ev.Headers = map[string]string{"Nats-TTL": "1h", "ce-partitionkey": "p1"}
	msg, err := encode(ev, "ferry.orders", "FERRY")
	require.NoError(t, err)
	require.Equal(t, "1h", msg.Header.Get("Nats-TTL"), "other Nats- headers are sent")
	got, err := Decode(msg)
	require.NoError(t, err)
	require.Equal(t, ev.ID, got.ID)
	require.Equal(t, map[string]string{"ce-partitionkey": "p1"}, got.Headers)
}

func TestEncodeUserContentTypeWithoutEventContentType(t *testing.T) {
	t.Parallel()
	ev := wireEvent()
	ev.ContentType = ""
	ev.Headers = map[string]string{"Content-Type": "text/plain"}
	msg, err := encode(ev, "ferry.orders", "FERRY")
	require.NoError(t, err)
	require.Equal(t, "text/plain", msg.Header.Get("Content-Type"))

	got, err := Decode(msg)
	require.NoError(t, err)
	require.Empty(t, got.ContentType)
	require.Equal(t, ev.Headers, got.Headers)
}

func TestEncodeRejectsHeaderName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"with space", "colon:", "tab\t", "ünï", "a/b", "{x}"} {
		ev := wireEvent()
		ev.Headers = map[string]string{name: "v"}
		_, err := encode(ev, "ferry.orders", "FERRY")
		require.True(t, ferrysink.IsPermanent(err), "header %q: %v", name, err)
	}
}

// FuzzDecode feeds Decode header blocks as the client parses them off the
// wire. Decode must never panic, and whatever it accepts must survive being
// published again: encoded and decoded, it is the same event (unless the
// sink refuses to publish it, permanently).
func FuzzDecode(f *testing.F) {
	ev := wireEvent()
	msg, err := encode(ev, "ferry.orders", "FERRY")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(headerBlock(msg.Header), msg.Data)
	f.Add("NATS/1.0\r\nce-specversion: 1.0\r\nce-id: 0190b4d2-5a8e-7c3e-8f00-000000000001\r\nce-source: s\r\nce-type: t\r\nce-subject: k\r\nce-time: 2024-02-29T23:59:59+23:59\r\nce-ferrytopic: o\r\n\r\n", []byte{})
	f.Add("NATS/1.0\r\nce-specversion: 1.0\r\nce-id: {0190b4d2-5a8e-7c3e-8f00-000000000001}\r\nce-source: s\r\nce-type: t\r\nce-subject: k\r\nce-time: 9999-12-31T23:59:59.999999999-00:01\r\nce-ferrytopic: o\r\nce-ferrykeyseq: +01\r\nCONTENT-type: a\r\nce-datacontenttype: b\r\nnats-x: y\r\n: empty\r\nx: 1\r\nx: 2\r\n\r\n", []byte("\x00"))
	f.Add("NATS/1.0 503\r\n\r\n", []byte(nil))

	f.Fuzz(func(t *testing.T, block string, data []byte) {
		h, err := nats.DecodeHeadersMsg([]byte(block))
		if err != nil {
			return
		}
		ev, err := Decode(&nats.Msg{Subject: "ferry.x", Header: h, Data: data})
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		again, err := encode(&ev, "ferry.x", "FERRY")
		if err != nil {
			if !ferrysink.IsPermanent(err) {
				t.Fatalf("encode of a decoded event failed with a retryable error: %v", err)
			}
			return
		}
		ev2, err := Decode(again)
		if err != nil {
			t.Fatalf("decoded event does not decode after encoding: %v\nevent: %+v", err, ev)
		}
		require.Equal(t, ev, ev2)
	})
}

// headerBlock writes h as NATS puts it on the wire.
func headerBlock(h nats.Header) string {
	var b strings.Builder
	b.WriteString("NATS/1.0\r\n")
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	b.WriteString("\r\n")
	return b.String()
}
