package ferrykafka

import (
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// Wire format
//
// One event is one Kafka record in the binary content mode of the
// CloudEvents Kafka protocol binding:
//
//   - key: the event Key (so that the partition, and the order, follow it);
//   - value: the Payload, as is;
//   - timestamp: when the sink published it (CreatedAt travels in ce_time):
//     a backlog published late must not look old to the topic's time-based
//     retention, nor to the client's delivery timeout;
//   - headers ce_<attribute>: every attribute of Event.CloudEventAttributes
//     (ce_id, ce_source, ce_type, ce_subject for the Key, ce_time,
//     ce_ferrytopic, ce_ferrykeyseq, ...);
//   - content-type: the ContentType, when set;
//   - the event's own Headers, under their own names.

// CloudEventsPrefix prefixes the CloudEvents attributes carried as record
// headers, as the CloudEvents Kafka protocol binding specifies.
const CloudEventsPrefix = "ce_"

// ContentTypeHeader carries the payload's media type.
const ContentTypeHeader = "content-type"

// ErrMalformed is returned, wrapped, by Decode when a record does not carry
// a well-formed Ferry event. Test for it with errors.Is.
var ErrMalformed = errors.New("ferrykafka: record is not a well-formed Ferry event")

// ferryOwns reports whether encode writes a header called name.
func ferryOwns(name string) bool {
	lower := strings.ToLower(name)
	return strings.HasPrefix(lower, CloudEventsPrefix) || lower == ContentTypeHeader
}

// encode builds the record of ev for topic. An event header named like
// one of Ferry's (which Emit refuses: ferryevent.ReservedHeader) fails the
// event with a ferrysink.PermanentError rather than being left out.
func encode(ev *ferryevent.Event, topic string) (*kgo.Record, error) {
	attrs := ev.CloudEventAttributes()
	headers := make([]kgo.RecordHeader, 0, len(ev.Headers)+len(attrs)+1)
	for name, value := range ev.Headers {
		if ferryOwns(name) {
			return nil, ferrysink.Permanent(fmt.Sprintf("event header %q is named like the ones Ferry writes itself (%s*, %s): rename it (Emit refuses such names)", name, CloudEventsPrefix, ContentTypeHeader), nil)
		}
		headers = append(headers, kgo.RecordHeader{Key: name, Value: []byte(value)})
	}
	for name, value := range attrs {
		headers = append(headers, kgo.RecordHeader{Key: CloudEventsPrefix + name, Value: []byte(value)})
	}
	if ev.ContentType != "" {
		headers = append(headers, kgo.RecordHeader{Key: ContentTypeHeader, Value: []byte(ev.ContentType)})
	}
	return &kgo.Record{Topic: topic, Key: []byte(ev.Key), Value: ev.Payload, Headers: headers}, nil
}

// size is the record's size as the broker counts it, near enough for the
// limit check: key, value and headers.
func size(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + 64
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}

// Decode reads the event a Ferry sink wrote into a record. It fails with an
// error wrapping ErrMalformed when a required attribute is missing or does
// not parse.
func Decode(r *kgo.Record) (ferryevent.Event, error) {
	if r == nil {
		return ferryevent.Event{}, fmt.Errorf("%w: nil record", ErrMalformed)
	}
	get := func(name string) string {
		for _, h := range r.Headers {
			if h.Key == name {
				return string(h.Value)
			}
		}
		return ""
	}
	ev, err := ferryevent.ParseCloudEventAttributes(func(name string) string { return get(CloudEventsPrefix + name) }, "header "+CloudEventsPrefix)
	if err != nil {
		return ev, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if key := string(r.Key); key != ev.Key {
		return ev, fmt.Errorf("%w: record key %q differs from %s%s %q", ErrMalformed, key, CloudEventsPrefix, ferryevent.CESubject, ev.Key)
	}
	if len(r.Value) > 0 {
		ev.Payload = r.Value
	}
	for _, h := range r.Headers {
		if h.Key == "" || ferryOwns(h.Key) {
			continue
		}
		if ev.Headers == nil {
			ev.Headers = make(map[string]string)
		}
		ev.Headers[h.Key] = string(h.Value)
	}
	return ev, nil
}
