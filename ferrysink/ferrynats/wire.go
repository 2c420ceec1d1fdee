package ferrynats

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Wire format
//
// One event is one JetStream message in the binary content mode of the
// CloudEvents NATS protocol binding:
//
//   - data: the Payload, as is;
//   - Nats-Msg-Id: the event ID, so that JetStream drops a republished copy
//     within the stream's duplicate window;
//   - Nats-Expected-Stream: the configured stream, so that a subject captured
//     by another stream is rejected rather than stored there;
//   - ce-<attribute>: every attribute of Event.CloudEventAttributes (ce-id,
//     ce-source, ce-type, ce-subject for the Key, ce-time, ce-ferrytopic,
//     ce-ferrykeyseq, ...);
//   - Content-Type: the ContentType again, when set, for tools that ignore
//     CloudEvents;
//   - the event's own Headers, under their own names.

// CloudEventsPrefix prefixes the CloudEvents attributes carried as message
// headers, as the CloudEvents NATS protocol binding specifies.
const CloudEventsPrefix = "ce-"

// ContentTypeHeader carries the payload's media type for consumers that do
// not read CloudEvents attributes.
const ContentTypeHeader = "Content-Type"

// natsPrefix is the lower-cased prefix of the headers NATS and JetStream
// interpret or add (Nats-Msg-Id, Nats-Expected-Stream, Nats-Stream, ...).
const natsPrefix = "nats-"

// ferryAttributes are the CloudEvents attributes the wire format maps onto
// Event fields.
var ferryAttributes = []string{
	ferryevent.CESpecVersion,
	ferryevent.CEID,
	ferryevent.CESource,
	ferryevent.CEType,
	ferryevent.CESubject,
	ferryevent.CETime,
	ferryevent.CEDataContentType,
	ferryevent.CEKeySeq,
	ferryevent.CETopic,
}

// ferryAttributeHeaders holds the header name of every attribute in
// ferryAttributes ("ce-id", ...). The names are lower case, as the binding
// writes them.
var ferryAttributeHeaders = func() map[string]bool {
	m := make(map[string]bool, len(ferryAttributes))
	for _, a := range ferryAttributes {
		m[CloudEventsPrefix+a] = true
	}
	return m
}()

// ErrMalformed is returned, wrapped, by Decode when a message does not carry
// a well-formed Ferry event. Test for it with errors.Is.
var ErrMalformed = errors.New("ferrynats: message is not a well-formed Ferry event")

// encode builds the message for ev on subject. stream, when not empty, is
// put in Nats-Expected-Stream. It fails with a ferrysink.PermanentError when
// a header name cannot be carried by NATS.
//
// A user header whose name equals one of Ferry's ignoring case (which Emit
// refuses: ferryevent.ReservedHeader) fails the event the same way, so a
// user header can never replace or shadow an attribute, the dedup ID or the
// expected stream, nor be dropped on the way.
func encode(ev *ferryevent.Event, subject, stream string) (*nats.Msg, error) {
	attrs := ev.CloudEventAttributes()
	h := make(nats.Header, len(ev.Headers)+len(attrs)+3)
	for name, value := range ev.Headers {
		if !validHeaderName(name) {
			return nil, permanent(fmt.Sprintf("header name %q cannot be carried by NATS: use printable ASCII without spaces or any of %s", name, forbiddenHeaderChars), nil)
		}
		if ferryOwns(name, ev.ContentType != "") {
			return nil, permanent(fmt.Sprintf("event header %q is named like one Ferry writes itself: rename it (Emit refuses such names)", name), nil)
		}
		h[name] = []string{value}
	}
	for name, value := range attrs {
		h[CloudEventsPrefix+name] = []string{value}
	}
	h[jetstream.MsgIDHeader] = []string{ev.ID.String()}
	if stream != "" {
		h[jetstream.ExpectedStreamHeader] = []string{stream}
	}
	if ev.ContentType != "" {
		h[ContentTypeHeader] = []string{ev.ContentType}
	}
	return &nats.Msg{Subject: subject, Header: h, Data: ev.Payload}, nil
}

// ferryOwns reports whether encode writes a header called name, ignoring
// case. Content-Type is Ferry's only when the event has a ContentType.
func ferryOwns(name string, hasContentType bool) bool {
	lower := strings.ToLower(name)
	switch {
	case ferryAttributeHeaders[lower]:
		return true
	case lower == strings.ToLower(jetstream.MsgIDHeader), lower == strings.ToLower(jetstream.ExpectedStreamHeader):
		return true
	case lower == strings.ToLower(ContentTypeHeader):
		return hasContentType
	}
	return false
}

// forbiddenHeaderChars are the printable ASCII characters that nats.go does
// not accept in a header name.
const forbiddenHeaderChars = `"()/,:;<=>?@[\]{}`

// validHeaderName reports whether nats.go will send name as a header name:
// printable ASCII other than space and forbiddenHeaderChars.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c > '~' || strings.IndexByte(forbiddenHeaderChars, c) >= 0 {
			return false
		}
	}
	return true
}

// Decode reads the Ferry event carried by msg, a message published by a
// ferrynats Sink (received on a subscription or read from a stream).
//
// Headers receives every message header except the CloudEvents attributes
// mapped onto Event fields, the headers NATS owns (any name starting with
// "Nats-", ignoring case) and Content-Type when the event has a content
// type; a header sent several times keeps its first value. Other ce-
// headers, such as CloudEvents extensions, stay in Headers under their full
// name. Payload shares memory with msg.Data.
//
// Decode fails with an error wrapping ErrMalformed when a required attribute
// (specversion 1.0, id, source, type, subject, time, ferrytopic) is missing
// or does not parse.
func Decode(msg *nats.Msg) (ferryevent.Event, error) {
	if msg == nil {
		return ferryevent.Event{}, fmt.Errorf("%w: nil message", ErrMalformed)
	}
	return decode(msg.Header, msg.Data)
}

// DecodeJetStream is Decode for a message delivered by a JetStream consumer.
func DecodeJetStream(msg jetstream.Msg) (ferryevent.Event, error) {
	if msg == nil {
		return ferryevent.Event{}, fmt.Errorf("%w: nil message", ErrMalformed)
	}
	return decode(msg.Headers(), msg.Data())
}

func decode(h nats.Header, data []byte) (ferryevent.Event, error) {
	ev, err := ferryevent.ParseCloudEventAttributes(func(name string) string { return h.Get(CloudEventsPrefix + name) }, "header "+CloudEventsPrefix)
	if err != nil {
		return ev, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(data) > 0 {
		ev.Payload = data
	}

	for name, values := range h {
		if len(values) == 0 || name == "" || strings.HasPrefix(strings.ToLower(name), natsPrefix) || ferryOwns(name, ev.ContentType != "") {
			continue
		}
		if ev.Headers == nil {
			ev.Headers = make(map[string]string)
		}
		ev.Headers[name] = values[0]
	}
	return ev, nil
}
