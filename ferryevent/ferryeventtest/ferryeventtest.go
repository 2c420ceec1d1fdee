// Package ferryeventtest holds the edge-case events that every sink's and
// every inbox's conformance suite sends through, to check Ferry's rule for
// events: every field of an event that ferryevent.Validate accepts arrives
// byte for byte, and what could not arrive so is refused at emit.
//
// Stability: this package may change between minor versions until 1.0.
package ferryeventtest

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Case is one edge-case event and what Validate must make of it.
type Case struct {
	// Name says what the case tries.
	Name string
	// Event is the event as a producer would hand it to Emit: not
	// prepared, without an ID unless the case is about one.
	Event *ferryevent.Event
	// Field is the field a ValidationError must name when the event is
	// refused; empty when the event must be accepted.
	Field string
	// Err is the sentinel the refusal must wrap.
	Err error
}

// Refused reports whether the case must be refused at emit.
func (c Case) Refused() bool { return c.Field != "" }

// Cases returns the edge-case table. maxPayload is the emit limit the
// caller will prepare the events with (ferryevent.DefaultMaxPayloadBytes
// when <= 0): one case fills it exactly, one goes a byte over. Every
// accepted case has a key of its own, so the accepted ones can be published
// in one call, each with Seq 1.
func Cases(maxPayload int) []Case {
	if maxPayload <= 0 {
		maxPayload = ferryevent.DefaultMaxPayloadBytes
	}
	rng := rand.New(rand.NewPCG(17, 0x5eed))
	printable := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('!' + rng.IntN('~'-'!'+1))
		}
		return string(b)
	}
	allBytes := make([]byte, 512)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	n := 0
	ev := func(edit func(*ferryevent.Event)) *ferryevent.Event {
		n++
		e := &ferryevent.Event{
			Topic:       "edge.cases",
			Key:         "edge-" + strconv.Itoa(n),
			Type:        "EdgeCase",
			Source:      "ferryeventtest",
			ContentType: "application/json",
			Payload:     []byte(`{"n":` + strconv.Itoa(n) + `}`),
			CreatedAt:   time.Date(2026, 3, 29, 1, 59, 58, 123456000, time.UTC),
		}
		edit(e)
		return e
	}
	accept := func(name string, edit func(*ferryevent.Event)) Case {
		return Case{Name: name, Event: ev(edit)}
	}
	refuse := func(name, field string, err error, edit func(*ferryevent.Event)) Case {
		return Case{Name: name, Event: ev(edit), Field: field, Err: err}
	}
	headers := func(kv ...string) map[string]string {
		h := make(map[string]string, len(kv)/2)
		for i := 0; i+1 < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		return h
	}
	full := func(e *ferryevent.Event) int { return maxPayload - ferryevent.EnvelopeBytes(e) }

	return []Case{
		accept("plain", func(*ferryevent.Event) {}),
		accept("key with inner spaces, quotes, percent signs and punctuation", func(e *ferryevent.Event) {
			e.Key = `customer 7/ü:€ "q" %41%zz a=b; c,d \ end`
		}),
		accept("non-ASCII key", func(e *ferryevent.Event) { e.Key = "клиент-42 ✓ 顧客" }),
		accept("key with invisible characters inside", func(e *ferryevent.Event) { e.Key = "a\u2028b\u200bc\ufeffd" }),
		accept("key of the longest length", func(e *ferryevent.Event) { e.Key = printable(ferryevent.MaxKeyBytes) }),
		accept("long topic", func(e *ferryevent.Event) {
			e.Topic = strings.Repeat("t", ferryevent.MaxTopicBytes-8) + ".a-b_c.9"
		}),
		accept("type, source and content type with punctuation and non-ASCII", func(e *ferryevent.Event) {
			e.Type = "com.example.Ünïcode✓.v1"
			e.Source = "https://example.com/a b?x=1&y=%20#frag"
			e.ContentType = `text/plain; charset="utf-8"`
		}),
		accept("content type of the longest length", func(e *ferryevent.Event) {
			e.ContentType = "application/x." + strings.Repeat("c", ferryevent.MaxContentTypeBytes-len("application/x."))
		}),
		accept("empty source and content type", func(e *ferryevent.Event) { e.Source, e.ContentType = "", "" }),
		accept("headers: empty, non-ASCII and comma-separated values, token punctuation in names, mixed case", func(e *ferryevent.Event) {
			e.Headers = headers(
				"X-Empty", "",
				"x-unicode", "ünïcode ✓ a  b\u00a0c",
				"X-List", `a, b; c="d, e"`,
				"x!#$%&'*+-.^_`|~1", "punctuation",
				"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				"User-Agent", "the producer's own",
				"Accept-Encoding", "identity",
				"X-Quoted", `"quoted"`,
			)
		}),
		accept("sixty-four headers", func(e *ferryevent.Event) {
			e.Headers = make(map[string]string, 64)
			for i := range 64 {
				e.Headers["x-h-"+strconv.Itoa(i)] = strconv.Itoa(rng.IntN(1 << 30))
			}
		}),
		accept("header value of the longest length", func(e *ferryevent.Event) {
			e.Headers = headers("x-long", printable(ferryevent.MaxHeaderValueBytes))
		}),
		accept("headers up to their total limit", func(e *ferryevent.Event) {
			e.Headers = headers("x-a", printable(ferryevent.MaxHeaderValueBytes), "x-b", printable(ferryevent.MaxHeaderValueBytes),
				"x-c", printable(ferryevent.MaxHeaderValueBytes), "x-d", printable(ferryevent.MaxHeadersBytes-3*ferryevent.MaxHeaderValueBytes-4*len("x-a")))
		}),
		accept("binary payload of every byte value", func(e *ferryevent.Event) {
			e.ContentType, e.Payload = "application/octet-stream", allBytes
		}),
		accept("nil payload", func(e *ferryevent.Event) { e.Payload = nil }),
		accept("empty payload", func(e *ferryevent.Event) { e.Payload = []byte{} }),
		accept("payload filling the limit with the envelope", func(e *ferryevent.Event) {
			e.ContentType = "application/octet-stream"
			e.Headers = headers("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			e.Payload = make([]byte, full(e))
			for i := range e.Payload {
				e.Payload[i] = byte(rng.Uint32())
			}
		}),
		accept("time with nanoseconds in another zone", func(e *ferryevent.Event) {
			e.CreatedAt = time.Date(2025, 3, 30, 1, 59, 58, 123456789, time.FixedZone("UTC+5:30", 5*3600+1800))
		}),
		accept("first year", func(e *ferryevent.Event) { e.CreatedAt = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC) }),
		accept("last moment of year 9999", func(e *ferryevent.Event) {
			e.CreatedAt = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
		}),
		accept("zero time", func(e *ferryevent.Event) { e.CreatedAt = time.Time{} }),

		refuse("LF in the key", "Key", ferryevent.ErrInvalidText, func(e *ferryevent.Event) { e.Key = "k\nnl" }),
		refuse("CR LF in the key", "Key", ferryevent.ErrInvalidText, func(e *ferryevent.Event) { e.Key = "k\r\nnl" }),
		refuse("tab in the key", "Key", ferryevent.ErrInvalidText, func(e *ferryevent.Event) { e.Key = "k\tt" }),
		refuse("NUL in the key", "Key", ferryevent.ErrInvalidText, func(e *ferryevent.Event) { e.Key = "k\x00" }),
		refuse("invalid UTF-8 in the key", "Key", ferryevent.ErrInvalidText, func(e *ferryevent.Event) { e.Key = "k\xff" }),
		refuse("spaces around the key", "Key", ferryevent.ErrSurroundingSpace, func(e *ferryevent.Event) { e.Key = "  k-sp  " }),
		refuse("no-break space ending the key", "Key", ferryevent.ErrSurroundingSpace, func(e *ferryevent.Event) { e.Key = "k\u00a0" }),
		refuse("10 KiB key", "Key", ferryevent.ErrFieldTooLong, func(e *ferryevent.Event) { e.Key = printable(10 << 10) }),
		refuse("blank key", "Key", ferryevent.ErrEmptyKey, func(e *ferryevent.Event) { e.Key = " " }),
		refuse("CR in the type", "Type", ferryevent.ErrInvalidText, func(e *ferryevent.Event) { e.Type = "T\r" }),
		refuse("space ending the type", "Type", ferryevent.ErrSurroundingSpace, func(e *ferryevent.Event) { e.Type = "T " }),
		refuse("LF in the source", "Source", ferryevent.ErrInvalidText, func(e *ferryevent.Event) { e.Source = "a\nb" }),
		refuse("space starting the source", "Source", ferryevent.ErrSurroundingSpace, func(e *ferryevent.Event) { e.Source = " s" }),
		refuse("content type over an AMQP short string", "ContentType", ferryevent.ErrFieldTooLong, func(e *ferryevent.Event) {
			e.ContentType = strings.Repeat("c", ferryevent.MaxContentTypeBytes+1)
		}),
		refuse("topic with a space", "Topic", ferryevent.ErrInvalidTopic, func(e *ferryevent.Event) { e.Topic = "a b" }),
		refuse("wildcard topic", "Topic", ferryevent.ErrInvalidTopic, func(e *ferryevent.Event) { e.Topic = ">" }),
		refuse("topic with a wildcard word", "Topic", ferryevent.ErrInvalidTopic, func(e *ferryevent.Event) { e.Topic = "orders.*" }),
		refuse("topic ending in a dot", "Topic", ferryevent.ErrInvalidTopic, func(e *ferryevent.Event) { e.Topic = "orders." }),
		refuse("topic with a slash", "Topic", ferryevent.ErrInvalidTopic, func(e *ferryevent.Event) { e.Topic = "orders/eu" }),
		refuse("topic over Kafka's name length", "Topic", ferryevent.ErrFieldTooLong, func(e *ferryevent.Event) {
			e.Topic = strings.Repeat("t", ferryevent.MaxTopicBytes+1)
		}),
		refuse("non-ASCII header name", "Headers", ferryevent.ErrInvalidHeaderName, func(e *ferryevent.Event) { e.Headers = headers("naïve", "x") }),
		refuse("header name with a space", "Headers", ferryevent.ErrInvalidHeaderName, func(e *ferryevent.Event) { e.Headers = headers("X Bad", "x") }),
		refuse("header names differing only in case", "Headers", ferryevent.ErrInvalidHeaderName, func(e *ferryevent.Event) {
			e.Headers = headers("X-Tenant", "a", "x-tenant", "b")
		}),
		refuse("header named ce-id", "Headers", ferryevent.ErrReservedHeader, func(e *ferryevent.Event) { e.Headers = headers("ce-id", "x") }),
		refuse("header named Nats-Msg-Id", "Headers", ferryevent.ErrReservedHeader, func(e *ferryevent.Event) { e.Headers = headers("Nats-Msg-Id", "x") }),
		refuse("header named Content-Type", "Headers", ferryevent.ErrReservedHeader, func(e *ferryevent.Event) { e.Headers = headers("Content-Type", "x") }),
		refuse("header named BCC", "Headers", ferryevent.ErrReservedHeader, func(e *ferryevent.Event) { e.Headers = headers("BCC", "q") }),
		refuse("CR LF in a header value", "Headers", ferryevent.ErrInvalidText, func(e *ferryevent.Event) { e.Headers = headers("x-a", "a\r\nb") }),
		refuse("header value with surrounding spaces", "Headers", ferryevent.ErrSurroundingSpace, func(e *ferryevent.Event) { e.Headers = headers("x-a", " v ") }),
		refuse("header value over 64 KiB", "Headers", ferryevent.ErrFieldTooLong, func(e *ferryevent.Event) { e.Headers = headers("x-a", printable(65<<10)) }),
		refuse("payload of the limit, leaving no room for the envelope", "Payload", ferryevent.ErrEventTooLarge, func(e *ferryevent.Event) {
			e.Payload = make([]byte, maxPayload)
		}),
		refuse("payload a byte over the limit with the envelope", "Payload", ferryevent.ErrEventTooLarge, func(e *ferryevent.Event) {
			e.Payload = make([]byte, full(e)+1)
		}),
		refuse("year 10000", "CreatedAt", ferryevent.ErrInvalidTime, func(e *ferryevent.Event) {
			e.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
		}),
	}
}

// Prepare prepares every case as Emit would, with maxPayload, checks that
// each is refused or accepted as the table says, and returns the accepted
// events with Seq 1 (each has a key of its own).
func Prepare(t testing.TB, cases []Case, maxPayload int) []*ferryevent.Event {
	t.Helper()
	var accepted []*ferryevent.Event
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i, c := range cases {
		err := ferryevent.Prepare(c.Event, i, maxPayload, now)
		if !c.Refused() {
			require.NoError(t, err, "case %q must be accepted at emit", c.Name)
			c.Event.Seq = 1
			accepted = append(accepted, c.Event)
			continue
		}
		require.ErrorIs(t, err, c.Err, "case %q must be refused at emit", c.Name)
		var ve *ferryevent.ValidationError
		require.True(t, errors.As(err, &ve), "case %q: want a *ValidationError, got %T", c.Name, err)
		require.Equal(t, c.Field, ve.Field, "case %q: the error must name the field", c.Name)
	}
	return accepted
}

// RequireSame fails t unless got carries every field of want exactly:
// ID, Topic, Key, Type, Source, Headers (nil and empty alike), ContentType,
// Payload (nil and empty alike), CreatedAt (the same instant) and Seq.
func RequireSame(t testing.TB, want, got *ferryevent.Event) {
	t.Helper()
	require.NotNil(t, got, "event %s (key %q) did not arrive", want.ID, want.Key)
	if d := diff(want, got); d != "" {
		require.Fail(t, "the event arrived changed", "event %s (key %.60q): %s", want.ID, want.Key, d)
	}
}

// diff describes the first field in which got differs from want, or
// returns "" when it carries every field exactly (see RequireSame).
func diff(want, got *ferryevent.Event) string {
	for _, f := range []struct {
		name      string
		want, got string
	}{
		{"ID", want.ID.String(), got.ID.String()},
		{"Topic", want.Topic, got.Topic},
		{"Key", want.Key, got.Key},
		{"Type", want.Type, got.Type},
		{"Source", want.Source, got.Source},
		{"ContentType", want.ContentType, got.ContentType},
	} {
		if f.want != f.got {
			return fmt.Sprintf("%s: sent %.80q, got %.80q", f.name, f.want, f.got)
		}
	}
	if len(want.Headers) != len(got.Headers) {
		return fmt.Sprintf("Headers: sent %d, got %d: %.300q", len(want.Headers), len(got.Headers), got.Headers)
	}
	for name, value := range want.Headers {
		v, ok := got.Headers[name]
		switch {
		case !ok:
			return fmt.Sprintf("Headers: %q is missing (got %.300q)", name, got.Headers)
		case v != value:
			return fmt.Sprintf("Headers: %q: sent %.80q, got %.80q", name, value, v)
		}
	}
	if !bytes.Equal(want.Payload, got.Payload) {
		return fmt.Sprintf("Payload: sent %d bytes, got %d", len(want.Payload), len(got.Payload))
	}
	if !want.CreatedAt.Equal(got.CreatedAt) {
		return fmt.Sprintf("CreatedAt: sent %s, got %s", want.CreatedAt.Format(time.RFC3339Nano), got.CreatedAt.Format(time.RFC3339Nano))
	}
	if want.Seq != got.Seq {
		return fmt.Sprintf("Seq: sent %d, got %d", want.Seq, got.Seq)
	}
	return ""
}

// Fuzz runs a wire fuzzer: it starts from the edge-case table, and for
// every generated event that Emit would accept (prepared as Emit does),
// roundTrip sends it across the wire and returns what the other side
// decoded, which must be the event exactly (RequireSame). Events Emit
// refuses are not sent.
func Fuzz(f *testing.F, roundTrip func(t *testing.T, ev *ferryevent.Event) *ferryevent.Event) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, topic, key, typ, source, contentType, headers string, payload []byte, created, seq int64) {
		ev := fuzzEvent(topic, key, typ, source, contentType, headers, payload, created, seq)
		if ev == nil {
			return // Emit refuses it
		}
		RequireSame(t, ev, roundTrip(t, ev))
	})
}

// addSeeds adds a seed to f for every case of the edge-case table, in the
// argument order of fuzzEvent.
func addSeeds(f *testing.F) {
	for _, c := range Cases(0) {
		ev := c.Event
		names := slices.Sorted(maps.Keys(ev.Headers))
		var headers []string
		for _, n := range names {
			headers = append(headers, n, ev.Headers[n])
		}
		f.Add(ev.Topic, ev.Key, ev.Type, ev.Source, ev.ContentType, strings.Join(headers, fuzzHeaderSep), ev.Payload, ev.CreatedAt.UnixMicro(), int64(1))
	}
}

// fuzzHeaderSep separates the names and values of the headers in one fuzz
// argument: name, value, name, value, ... (NUL is refused in both, so no
// header the fuzzer should try is lost to the encoding).
const fuzzHeaderSep = "\x00"

// fuzzEvent builds an event from a wire fuzzer's arguments and prepares
// it as Emit would. It returns nil when Emit would refuse it: only what
// Validate accepts must cross a wire unchanged.
func fuzzEvent(topic, key, typ, source, contentType, headers string, payload []byte, createdMicros, seq int64) *ferryevent.Event {
	ev := &ferryevent.Event{
		Topic: topic, Key: key, Type: typ, Source: source, ContentType: contentType,
		Payload: payload, CreatedAt: time.UnixMicro(createdMicros),
	}
	if headers != "" {
		parts := strings.Split(headers, fuzzHeaderSep)
		ev.Headers = make(map[string]string, (len(parts)+1)/2)
		for i := 0; i < len(parts); i += 2 {
			value := ""
			if i+1 < len(parts) {
				value = parts[i+1]
			}
			ev.Headers[parts[i]] = value
		}
	}
	if ferryevent.Prepare(ev, 0, 0, time.Now()) != nil {
		return nil
	}
	if seq > 0 {
		ev.Seq = seq
	}
	return ev
}
