package ferrywebhook

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// Wire format
//
// One event is one POST in the binary content mode of the CloudEvents HTTP
// protocol binding (see doc.go for the table):
//
//   - body: the Payload, as is;
//   - Content-Type: the ContentType, when set (the binding maps
//     datacontenttype there, not to a ce- header);
//   - ce-<attribute>: every other attribute of Event.CloudEventAttributes,
//     percent-encoded as the binding requires;
//   - webhook-id, webhook-timestamp, webhook-signature: Standard Webhooks;
//   - the event's Headers under their own names, and Ferry-Headers listing
//     those names as the event spelled them, so that a receiver can tell
//     them from the headers HTTP and proxies add, and restore their case.

// CloudEventsPrefix prefixes the CloudEvents attributes carried as HTTP
// headers, as the CloudEvents HTTP protocol binding specifies.
const CloudEventsPrefix = "ce-"

// HeaderList names the header listing the event's own headers, comma
// separated, as the event spelled them.
const HeaderList = "Ferry-Headers"

// ErrMalformed is returned, wrapped, by DecodeRequest when a request does not
// carry a well-formed Ferry event. Test for it with errors.Is.
var ErrMalformed = errors.New("ferrywebhook: request is not a well-formed Ferry event")

// hopHeaders are the lower-cased names HTTP itself manages; neither
// Config.Header nor an event may set them.
var hopHeaders = map[string]bool{
	"host":                true,
	"content-length":      true,
	"transfer-encoding":   true,
	"connection":          true,
	"keep-alive":          true,
	"proxy-connection":    true,
	"te":                  true,
	"trailer":             true,
	"upgrade":             true,
	"expect":              true,
	"content-encoding":    true,
	"proxy-authorization": true,
}

// reservedHeader reports whether lower, a lower-cased header name, belongs to
// Ferry (the CloudEvents and Standard Webhooks headers, Content-Type,
// Ferry-Headers) or to HTTP.
func reservedHeader(lower string) bool {
	switch {
	case strings.HasPrefix(lower, CloudEventsPrefix), strings.HasPrefix(lower, "webhook-"):
		return true
	case lower == "content-type", lower == "ferry-headers":
		return true
	}
	return hopHeaders[lower]
}

// encodeHeader builds the request header of ev that stays the same across
// attempts: everything but webhook-timestamp and webhook-signature. static
// is Config.Header with canonical names. It fails with a
// ferrysink.PermanentError when HTTP cannot carry the event's headers or
// content type.
//
// Event headers go in first, then static, then Ferry's own. An event
// header named like one of the latter two (ignoring case) fails the event
// rather than being left out, so an event can never replace an attribute,
// the signature or the sink's credentials, nor arrive without one of its
// headers.
func encodeHeader(ev *ferryevent.Event, static http.Header) (http.Header, error) {
	attrs := ev.CloudEventAttributes()
	h := make(http.Header, len(ev.Headers)+len(static)+len(attrs)+4)
	agent := len(static.Values("User-Agent")) > 0

	if len(ev.Headers) > 0 {
		names := make([]string, 0, len(ev.Headers))
		for name := range ev.Headers {
			names = append(names, name)
		}
		slices.Sort(names)
		lowered := make(map[string]string, len(names))
		listed := make([]string, 0, len(names))
		for _, name := range names {
			if !ferryevent.IsToken(name) {
				return nil, ferrysink.Permanent(fmt.Sprintf("event header name %q cannot be sent over HTTP: use ASCII letters, digits and !#$%%&'*+-.^_`|~ only", name), nil)
			}
			lower := strings.ToLower(name)
			if other, dup := lowered[lower]; dup {
				return nil, ferrysink.Permanent(fmt.Sprintf("event headers %q and %q differ only in case, and HTTP header names ignore case: keep one", other, name), nil)
			}
			lowered[lower] = name
			switch {
			case reservedHeader(lower):
				return nil, ferrysink.Permanent(fmt.Sprintf("event header %q is one Ferry or HTTP writes itself: rename it (Emit refuses such names)", name), nil)
			case len(static.Values(name)) > 0:
				return nil, ferrysink.Permanent(fmt.Sprintf("event header %q is also set by the sink's Config.Header, which would replace it: rename one of them", name), nil)
			}
			agent = agent || lower == "user-agent"
			// Canonical, as every http.Header user expects: a client
			// middleware setting Traceparent must replace the event's
			// traceparent, not add a second one.
			h.Set(name, headerValue(ev.Headers[name]))
			listed = append(listed, name)
		}
		if len(listed) > 0 {
			h.Set(HeaderList, strings.Join(listed, ","))
		}
	}
	for name, values := range static {
		h[name] = slices.Clip(values) // shared: an Add in a RoundTripper must copy
	}
	for name, value := range attrs {
		if name == ferryevent.CEDataContentType {
			continue
		}
		h.Set(CloudEventsPrefix+name, percentEncode(value))
	}
	if ev.ContentType != "" {
		if !validHeaderValue(ev.ContentType) {
			return nil, ferrysink.Permanent(fmt.Sprintf("content type %q cannot be sent as an HTTP Content-Type: it holds a control character", ev.ContentType), nil)
		}
		h.Set("Content-Type", ev.ContentType)
	}
	h.Set(HeaderID, ev.ID.String())
	if !agent {
		h.Set("User-Agent", userAgent)
	}
	return h, nil
}

// userAgent is sent unless Config.Header or the event sets User-Agent.
const userAgent = "ferrywebhook (+https://github.com/ferry-dev/ferry)"

// headerValue makes v sendable as a header value: control characters other
// than tab (CR and LF included) become spaces. Other bytes, UTF-8 included,
// are sent as they are.
func headerValue(v string) string {
	if validHeaderValue(v) {
		return v
	}
	b := []byte(v)
	for i, c := range b {
		if isCTL(c) {
			b[i] = ' '
		}
	}
	return string(b)
}

func isCTL(c byte) bool { return (c < ' ' && c != '\t') || c == 0x7f }

func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if isCTL(v[i]) {
			return false
		}
	}
	return true
}

// percentEncode encodes an attribute value as the CloudEvents HTTP binding
// asks: the UTF-8 bytes of space, '"', '%' and everything outside printable
// ASCII become %XX.
func percentEncode(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if mustEscape(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if mustEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&0xf])
			continue
		}
		b = append(b, c)
	}
	return string(b)
}

func mustEscape(c byte) bool {
	return c <= ' ' || c > '~' || c == '"' || c == '%'
}

// percentDecode reverses percentEncode. It fails on a '%' not followed by
// two hex digits and on a result that is not UTF-8.
func percentDecode(s string) (string, error) {
	if strings.IndexByte(s, '%') < 0 {
		if !utf8.ValidString(s) {
			return "", errors.New("not UTF-8")
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("%q ends in an incomplete %%-escape", s)
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("%q holds %q, which is not a %%-escape", s, s[i:i+3])
		}
		b = append(b, hi<<4|lo)
		i += 2
	}
	if !utf8.Valid(b) {
		return "", fmt.Errorf("%q does not decode to UTF-8", s)
	}
	return string(b), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// DecodeRequest reads the Ferry event carried by r, a request sent by a
// ferrywebhook Sink. It reads r.Body to the end: wrap it in
// http.MaxBytesReader first to bound what a client can make it read
// (Handler does). It does not check the signature: call Verify with
// r.Header and the event's Payload, or use Handler, which does both.
//
// The attributes come from the ce- headers (percent-decoded) and
// Content-Type; Headers holds the headers named in Ferry-Headers, each with
// its first value and the name as the event spelled it, and never the
// headers HTTP, proxies or Config.Header add. Payload is nil for an empty
// body.
//
// DecodeRequest fails with an error wrapping ErrMalformed when a required
// attribute (specversion 1.0, id, source, type, subject, time, ferrytopic)
// is missing or does not parse, or when the body cannot be read.
func DecodeRequest(r *http.Request) (ferryevent.Event, error) {
	if r == nil {
		return ferryevent.Event{}, fmt.Errorf("%w: nil request", ErrMalformed)
	}
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return ferryevent.Event{}, fmt.Errorf("%w: read the body: %v", ErrMalformed, err)
		}
	}
	return decode(r.Header, body)
}

// decode builds the event carried by a request's header and body.
func decode(h http.Header, body []byte) (ferryevent.Event, error) {
	var bad error
	attr := func(name string) string {
		if name == ferryevent.CEDataContentType {
			return h.Get("Content-Type")
		}
		v, err := percentDecode(h.Get(CloudEventsPrefix + name))
		if err != nil && bad == nil {
			bad = fmt.Errorf("header %s%s: %v", CloudEventsPrefix, name, err)
		}
		return v
	}
	ev, err := ferryevent.ParseCloudEventAttributes(attr, "header "+CloudEventsPrefix)
	if bad != nil {
		return ferryevent.Event{}, fmt.Errorf("%w: %v", ErrMalformed, bad)
	}
	if err != nil {
		if strings.HasPrefix(h.Get("Content-Type"), "application/cloudevents") {
			err = fmt.Errorf("%v (the request is in the CloudEvents structured mode; Ferry sends and reads the binary mode)", err)
		}
		return ferryevent.Event{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(body) > 0 {
		ev.Payload = body
	}
	for _, list := range h.Values(HeaderList) {
		for name := range strings.SplitSeq(list, ",") {
			name = strings.TrimSpace(name)
			if !ferryevent.IsToken(name) || reservedHeader(strings.ToLower(name)) {
				continue
			}
			values := h.Values(name)
			if len(values) == 0 {
				continue // dropped on the way
			}
			if _, dup := ev.Headers[name]; dup {
				continue
			}
			if ev.Headers == nil {
				ev.Headers = make(map[string]string)
			}
			ev.Headers[name] = values[0]
		}
	}
	return ev, nil
}
