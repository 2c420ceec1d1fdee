package ferryrabbit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Wire format
//
// One event is one AMQP 0-9-1 message in the binary content mode of the
// CloudEvents AMQP protocol binding, whose application-properties RabbitMQ
// carries as the message's headers table:
//
//   - body: the Payload, as is;
//   - properties: message-id = the event ID, content-type = the
//     ContentType (the binding's datacontenttype), timestamp = CreatedAt in
//     whole seconds, delivery-mode = 2 (persistent);
//   - headers: cloudEvents_<attribute> for every other attribute of
//     Event.CloudEventAttributes, as strings (cloudEvents_specversion,
//     cloudEvents_id, cloudEvents_source, cloudEvents_type,
//     cloudEvents_subject for the Key, cloudEvents_time,
//     cloudEvents_ferrytopic, cloudEvents_ferrykeyseq), then the event's
//     own Headers under their own names.

// CloudEventsPrefix prefixes the CloudEvents attributes carried as message
// headers. The CloudEvents AMQP binding allows "cloudEvents_" and
// "cloudEvents:" and prefers the underscore, which JMS clients and message
// selectors can read; the sink writes it.
const CloudEventsPrefix = "cloudEvents_"

// CloudEventsColonPrefix is the binding's other prefix. Decode accepts
// messages that use it, as the binding asks of consumers.
const CloudEventsColonPrefix = "cloudEvents:"

// ferryAttributes are the CloudEvents attributes the wire format maps onto
// Event fields.
var ferryAttributes = map[string]bool{
	ferryevent.CESpecVersion:     true,
	ferryevent.CEID:              true,
	ferryevent.CESource:          true,
	ferryevent.CEType:            true,
	ferryevent.CESubject:         true,
	ferryevent.CETime:            true,
	ferryevent.CEDataContentType: true,
	ferryevent.CEKeySeq:          true,
	ferryevent.CETopic:           true,
}

// brokerHeaders are the headers RabbitMQ itself adds to a message (dead
// lettering, quorum queue redeliveries, shovels and federation). Decode
// leaves them out of Event.Headers.
var brokerHeaders = map[string]bool{
	"x-death":                true,
	"x-first-death-exchange": true,
	"x-first-death-queue":    true,
	"x-first-death-reason":   true,
	"x-last-death-exchange":  true,
	"x-last-death-queue":     true,
	"x-last-death-reason":    true,
	"x-delivery-count":       true,
	"x-received-from":        true,
}

// ErrMalformed is returned, wrapped, by Decode when a message does not carry
// a well-formed Ferry event. Test for it with errors.Is.
var ErrMalformed = errors.New("ferryrabbit: message is not a well-formed Ferry event")

// ferryOwns reports whether a header called name carries one of the
// attributes in ferryAttributes, with either prefix and ignoring case.
func ferryOwns(name string) bool {
	lower := strings.ToLower(name)
	for _, prefix := range []string{"cloudevents_", "cloudevents:"} {
		if attr, ok := strings.CutPrefix(lower, prefix); ok && ferryAttributes[attr] {
			return true
		}
	}
	return false
}

// encode builds the message for ev. It fails with a ferrysink.PermanentError
// when the event cannot be carried by AMQP 0-9-1.
//
// A user header whose name is one of Ferry's attribute headers, ignoring
// case and with either prefix, fails the event too (Emit refuses such
// names): it could never be told apart from the attribute.
func encode(ev *ferryevent.Event) (amqp.Publishing, error) {
	attrs := ev.CloudEventAttributes()
	h := make(amqp.Table, len(ev.Headers)+len(attrs))
	for name, value := range ev.Headers {
		if len(name) > maxShortString {
			return amqp.Publishing{}, permanent(fmt.Sprintf("header name %.40q... is %d bytes long; AMQP header names are at most %d bytes", name, len(name), maxShortString), nil)
		}
		if ferryOwns(name) {
			return amqp.Publishing{}, permanent(fmt.Sprintf("event header %q is named like an attribute Ferry writes itself: rename it (Emit refuses such names)", name), nil)
		}
		h[name] = value
	}
	for name, value := range attrs {
		// The binding carries datacontenttype in the content-type property
		// only.
		if name != ferryevent.CEDataContentType {
			h[CloudEventsPrefix+name] = value
		}
	}
	if len(ev.ContentType) > maxShortString {
		return amqp.Publishing{}, permanent(fmt.Sprintf("content type is %d bytes long; the AMQP content-type property holds at most %d", len(ev.ContentType), maxShortString), nil)
	}
	msg := amqp.Publishing{
		Headers:      h,
		ContentType:  ev.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    ev.ID.String(),
		Body:         ev.Payload,
	}
	if ev.CreatedAt.Unix() > 0 {
		msg.Timestamp = ev.CreatedAt
	}
	return msg, nil
}

// headerFrameSize is the size of the AMQP content header frame carrying
// msg's properties. RabbitMQ cannot split it: it must fit in the
// connection's frame_max.
func headerFrameSize(msg *amqp.Publishing) int {
	n := 8 + 14 // frame envelope; class, weight, body size, property flags
	n += 1 + len(msg.ContentType) + 1 + len(msg.MessageId) + 1 + 8
	n += 4
	for name, value := range msg.Headers {
		n += 1 + len(name) + 1 + 4
		if s, ok := value.(string); ok {
			n += len(s)
		}
	}
	return n
}

// Decode reads the Ferry event carried by d, a message published by a
// ferryrabbit Sink and delivered by RabbitMQ (from Channel.Consume or
// Channel.Get).
//
// It reads the CloudEvents attributes from the cloudEvents_ headers, or the
// cloudEvents: ones when the message uses that prefix, and datacontenttype
// from the content-type property. Attribute values may be strings or, as
// the binding allows, native AMQP values (a timestamp for time, an integer
// for ferrykeyseq).
//
// Headers receives every other header whose value is a string, except the
// ones RabbitMQ adds (x-death, x-first-death-*, x-last-death-*,
// x-delivery-count, x-received-from). Other cloudEvents_ headers, such as
// CloudEvents extensions, stay in Headers under their full name. Payload
// shares memory with d.Body.
//
// Decode fails with an error wrapping ErrMalformed when a required attribute
// (specversion 1.0, id, source, type, subject, time, ferrytopic) is missing
// or does not parse.
func Decode(d amqp.Delivery) (ferryevent.Event, error) {
	return decode(d.Headers, d.ContentType, d.Body)
}

func decode(h amqp.Table, contentType string, body []byte) (ferryevent.Event, error) {
	// The binding asks for one prefix per message.
	prefix := CloudEventsPrefix
	if _, ok := h[prefix+ferryevent.CESpecVersion]; !ok {
		if _, ok := h[CloudEventsColonPrefix+ferryevent.CESpecVersion]; ok {
			prefix = CloudEventsColonPrefix
		}
	}
	attr := func(name string) string {
		if name == ferryevent.CEDataContentType && contentType != "" {
			return contentType
		}
		return attributeString(h[prefix+name])
	}
	ev, err := ferryevent.ParseCloudEventAttributes(attr, "header "+prefix)
	if err != nil {
		return ev, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(body) > 0 {
		ev.Payload = body
	}
	for name, value := range h {
		s, ok := value.(string)
		if !ok || name == "" || brokerHeaders[strings.ToLower(name)] || ferryOwns(name) {
			continue
		}
		if ev.Headers == nil {
			ev.Headers = make(map[string]string)
		}
		ev.Headers[name] = s
	}
	return ev, nil
}

// attributeString renders an attribute header's value in the canonical
// string form of CloudEvents, or returns "" for a value that has none.
func attributeString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case bool:
		return strconv.FormatBool(v)
	case int8:
		return strconv.FormatInt(int64(v), 10)
	case int16:
		return strconv.FormatInt(int64(v), 10)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case int64:
		return strconv.FormatInt(v, 10)
	case int:
		return strconv.Itoa(v)
	case uint8:
		return strconv.FormatUint(uint64(v), 10)
	case uint16:
		return strconv.FormatUint(uint64(v), 10)
	case uint32:
		return strconv.FormatUint(uint64(v), 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return strconv.FormatInt(int64(v), 10)
		}
	}
	return ""
}
