package ferryevent

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// CloudEvents attribute names used on the wire (binary content mode). Sinks
// write them as message headers, with a transport-specific prefix where the
// transport binding asks for one ("ce-" for HTTP, Kafka and NATS).
const (
	CESpecVersion     = "specversion"
	CEID              = "id"
	CESource          = "source"
	CEType            = "type"
	CESubject         = "subject"
	CETime            = "time"
	CEDataContentType = "datacontenttype"
	// CEKeySeq is a Ferry extension attribute: the event's Seq within its
	// key (which restarts at 1 for a key idle long enough: see Event.Seq).
	// Consumers use it to detect gaps and regressions.
	CEKeySeq = "ferrykeyseq"
	// CETopic is a Ferry extension attribute carrying the event's Topic.
	CETopic = "ferrytopic"
)

// DefaultSource is used for the CloudEvents "source" attribute when an
// event has no Source; the attribute is required by the specification.
const DefaultSource = "ferry"

// CloudEventAttributes returns the CloudEvents 1.0 context attributes of ev:
// id, source, type, subject (the Key), time, datacontenttype, plus Ferry's
// extensions. Keys are attribute names without a transport prefix.
func (ev *Event) CloudEventAttributes() map[string]string {
	src := ev.Source
	if src == "" {
		src = DefaultSource
	}
	attrs := map[string]string{
		CESpecVersion: "1.0",
		CEID:          ev.ID.String(),
		CESource:      src,
		CEType:        ev.Type,
		CESubject:     ev.Key,
		CETime:        ev.CreatedAt.UTC().Format(time.RFC3339Nano),
		CETopic:       ev.Topic,
	}
	if ev.ContentType != "" {
		attrs[CEDataContentType] = ev.ContentType
	}
	if ev.Seq > 0 {
		attrs[CEKeySeq] = strconv.FormatInt(ev.Seq, 10)
	}
	return attrs
}

// ParseCloudEventAttributes builds an event from the binary-mode CloudEvents
// attributes a sink wrote (see CloudEventAttributes): attr returns the value
// of an attribute by name, "" when absent, and prefix is how the transport
// names attributes ("ce-" for headers), used in error messages. Payload and
// Headers are left for the caller, which knows the transport.
//
// It fails, saying which attribute is wrong, when a required one
// (specversion 1.0, id, source, type, subject, time, ferrytopic) is missing
// or does not parse. Transports wrap the error with their own sentinel.
func ParseCloudEventAttributes(attr func(name string) string, prefix string) (Event, error) {
	var ev Event
	required := func(name string) (string, error) {
		v := attr(name)
		if strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("%s%s is missing or empty", prefix, name)
		}
		return v, nil
	}
	spec, err := required(CESpecVersion)
	if err != nil {
		return ev, err
	}
	if spec != "1.0" {
		return ev, fmt.Errorf("CloudEvents specversion %q, want 1.0", spec)
	}
	id, err := required(CEID)
	if err != nil {
		return ev, err
	}
	if ev.ID, err = uuid.Parse(id); err != nil {
		return ev, fmt.Errorf("%s%s: %q is not a UUID: %v", prefix, CEID, id, err)
	}
	if ev.ID == uuid.Nil {
		return ev, fmt.Errorf("%s%s is the nil UUID", prefix, CEID)
	}
	for _, f := range []struct {
		attr string
		dst  *string
	}{{CESource, &ev.Source}, {CEType, &ev.Type}, {CESubject, &ev.Key}, {CETopic, &ev.Topic}} {
		if *f.dst, err = required(f.attr); err != nil {
			return ev, err
		}
	}
	ts, err := required(CETime)
	if err != nil {
		return ev, err
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return ev, fmt.Errorf("%s%s: %q is not an RFC 3339 time: %v", prefix, CETime, ts, err)
	}
	// Keep to the years RFC 3339 can write, so that a decoded event can
	// always be published again.
	if t = t.UTC(); t.Year() < 0 || t.Year() > 9999 {
		return ev, fmt.Errorf("%s%s: %q is outside years 0000-9999 in UTC", prefix, CETime, ts)
	}
	ev.CreatedAt = t
	if seq := attr(CEKeySeq); seq != "" {
		n, err := strconv.ParseInt(seq, 10, 64)
		if err != nil || n <= 0 {
			return ev, fmt.Errorf("%s%s: %q is not a positive integer", prefix, CEKeySeq, seq)
		}
		ev.Seq = n
	}
	ev.ContentType = attr(CEDataContentType)
	return ev, nil
}
