package ferryevent

import (
	"strconv"
	"time"
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
	// CEKeySeq is a Ferry extension attribute: the event's Seq within its key.
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
