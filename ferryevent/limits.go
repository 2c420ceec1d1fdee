package ferryevent

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits of an event's fields, checked by Validate. They are set so that
// every sink Ferry ships (NATS JetStream, Kafka, RabbitMQ, webhooks) and
// every outbox and inbox store can carry the field unchanged, with room to
// spare: an index entry holds a key, an AMQP short string a content type or
// a header name, an HTTP server's header buffer a header line.
const (
	// MaxTopicBytes bounds Topic. Kafka topic names hold 249 bytes,
	// a sink's topic or subject prefix included.
	MaxTopicBytes = 200
	// MaxKeyBytes bounds Key, which PostgreSQL indexes (at most about
	// 2,700 bytes an entry) and webhooks send percent-encoded.
	MaxKeyBytes = 1024
	// MaxTypeBytes bounds Type.
	MaxTypeBytes = 256
	// MaxSourceBytes bounds Source.
	MaxSourceBytes = 1024
	// MaxContentTypeBytes bounds ContentType: an AMQP short string.
	MaxContentTypeBytes = 255
	// MaxHeaderNameBytes bounds each header name.
	MaxHeaderNameBytes = 128
	// MaxHeaderValueBytes bounds each header value.
	MaxHeaderValueBytes = 8 << 10
	// MaxHeadersBytes bounds the event's headers together, names and
	// values.
	MaxHeadersBytes = 32 << 10
)

// envelopeReserve is what EnvelopeBytes adds for what a sink writes beyond
// the event's own fields: the JetStream stream name, the Kafka record
// framing, the HTTP request line.
const envelopeReserve = 256

// ValidTopic reports whether topic follows the grammar every sink can
// carry as a subject, topic name or routing key: one or more words of ASCII
// letters, digits, '-' and '_', joined by single dots ("orders",
// "billing.invoice-paid", "audit_log.v2"), at most MaxTopicBytes. NATS
// wildcards, spaces and empty words ("orders.", "a..b") are not topics.
func ValidTopic(topic string) bool { return checkTopic(topic) == nil }

func checkTopic(topic string) error {
	if len(topic) > MaxTopicBytes {
		return ErrFieldTooLong
	}
	word := 0
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
			word++
		case c == '.' && word > 0:
			word = 0
		default:
			return ErrInvalidTopic
		}
	}
	if word == 0 {
		return ErrInvalidTopic
	}
	return nil
}

// checkText checks a text field or header value: valid UTF-8, no control
// character, no white space at either end, at most limit bytes. It returns
// the sentinel and a detail for the error.
func checkText(s string, limit int) (string, error) {
	if len(s) > limit {
		return fmt.Sprintf("%d bytes, limit %d", len(s), limit), ErrFieldTooLong
	}
	if !utf8.ValidString(s) {
		i := 0
		for i < len(s) {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			i += size
		}
		return fmt.Sprintf("byte %d is not UTF-8", i), ErrInvalidText
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Sprintf("control character %U at byte %d; encode the value (for example in base64) or leave the character out", r, i), ErrInvalidText
		}
	}
	if s != strings.TrimSpace(s) {
		return fmt.Sprintf("%.40q: message headers trim it on the way; trim it before emitting", s), ErrSurroundingSpace
	}
	return "", nil
}

// reservedHeaderPrefixes and reservedHeaderNames are the lower-cased header
// names ReservedHeader refuses: those a sink writes itself (CloudEvents
// attributes under each binding's prefix, Nats-Msg-Id and the rest of
// NATS's, Standard Webhooks, Content-Type, Ferry-Headers), those a broker
// adds or acts on (RabbitMQ's dead-lettering headers and its CC/BCC
// routing), and those HTTP manages itself.
var (
	reservedHeaderPrefixes = []string{"ce-", "ce_", "cloudevents_", "nats-", "webhook-", "x-first-death-", "x-last-death-"}
	reservedHeaderNames    = []string{
		"content-type", "ferry-headers",
		"x-death", "x-delivery-count", "x-received-from", "cc", "bcc",
		"host", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection",
		"te", "trailer", "upgrade", "expect", "content-encoding", "proxy-authorization",
	}
)

// ReservedHeader reports whether an event header called name (ignoring
// case) would clash with what a sink, a broker or HTTP writes or acts on:
// names starting with "ce-", "ce_", "cloudEvents_", "Nats-", "webhook-",
// "x-first-death-" or "x-last-death-", and Content-Type, Ferry-Headers,
// x-death, x-delivery-count, x-received-from, CC, BCC and HTTP's own
// (Host, Content-Length, Transfer-Encoding, Connection, Keep-Alive,
// Proxy-Connection, TE, Trailer, Upgrade, Expect, Content-Encoding,
// Proxy-Authorization). Set ContentType for the payload's media type.
func ReservedHeader(name string) bool {
	lower := strings.ToLower(name)
	for _, p := range reservedHeaderPrefixes {
		if strings.HasPrefix(lower, p) {
			return true
		}
	}
	return slices.Contains(reservedHeaderNames, lower)
}

// ValidHeaderName reports whether name is an HTTP token (see IsToken) of
// at most MaxHeaderNameBytes, which every sink carries as a header name. It
// does not check ReservedHeader.
func ValidHeaderName(name string) bool {
	return len(name) <= MaxHeaderNameBytes && IsToken(name)
}

// IsToken reports whether s is an HTTP token (RFC 9110, section 5.6.2:
// one or more ASCII letters, digits and !#$%&'*+-.^_`|~), the syntax of a
// header name.
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func checkHeaders(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "", nil
	}
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names) // the same event always fails on the same header
	total := 0
	lowered := make(map[string]string, len(names))
	for _, name := range names {
		switch {
		case !ValidHeaderName(name):
			return fmt.Sprintf("%.60q: use ASCII letters, digits and !#$%%&'*+-.^_`|~ only, at most %d bytes (the syntax of an HTTP header name)", name, MaxHeaderNameBytes), ErrInvalidHeaderName
		case ReservedHeader(name):
			return fmt.Sprintf("%q is written or read by a sink, a broker or HTTP itself; rename it (ContentType carries the media type)", name), ErrReservedHeader
		}
		lower := strings.ToLower(name)
		if other, dup := lowered[lower]; dup {
			return fmt.Sprintf("%q and %q differ only in case, and HTTP header names ignore case: keep one", other, name), ErrInvalidHeaderName
		}
		lowered[lower] = name
		if detail, err := checkText(h[name], MaxHeaderValueBytes); err != nil {
			return fmt.Sprintf("header %q: %s", name, detail), err
		}
		total += len(name) + len(h[name])
	}
	if total > MaxHeadersBytes {
		return fmt.Sprintf("%d bytes of header names and values, limit %d", total, MaxHeadersBytes), ErrFieldTooLong
	}
	return "", nil
}

// EnvelopeBytes returns an upper bound of what a sink adds to the payload
// of ev on the wire and a broker counts against its message size limit:
// the CloudEvents attributes and the event's headers as NATS writes them
// ("name: value\r\n"), the key again (Kafka's record key), and a reserve
// for the sink's own headers and framing. Validate keeps len(Payload) +
// EnvelopeBytes(ev) within the configured limit.
func EnvelopeBytes(ev *Event) int {
	// Per header: ": " and CRLF for NATS, length varints and more for
	// Kafka.
	const line = 8
	n := len("NATS/1.0\r\n\r\n") + envelopeReserve + len(ev.Key)
	attr := func(name string, value int) { n += len("ce-") + len(name) + value + line }
	attr(CESpecVersion, len("1.0"))
	attr(CEID, 36)
	attr(CESource, max(len(ev.Source), len(DefaultSource)))
	attr(CEType, len(ev.Type))
	attr(CESubject, len(ev.Key))
	attr(CETime, len("2006-01-02T15:04:05.999999999Z"))
	attr(CETopic, len(ev.Topic))
	attr(CEKeySeq, 19)
	if ev.ContentType != "" {
		attr(CEDataContentType, len(ev.ContentType))
		n += len("Content-Type") + len(ev.ContentType) + line
	}
	n += len("Nats-Msg-Id") + 36 + line
	for name, value := range ev.Headers {
		n += len(name) + len(value) + line
	}
	return n
}
