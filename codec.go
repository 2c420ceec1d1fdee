package ferry

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"reflect"
	"strings"
	"sync"
)

// Codec turns typed messages into event payloads and back. Its ContentType
// is what the events it encodes carry (Event.ContentType), and what tells a
// handler which codec decodes them.
//
// JSON is built in and is the default. Protocol Buffers come with package
// ferryproto: register its codec once at start, ferry.RegisterCodec(
// ferryproto.Codec{}), and a proto.Message is encoded and decoded with it.
type Codec interface {
	// ContentType is the media type of the payloads the codec writes.
	ContentType() string
	// Encodes reports whether the codec is the one for messages of type t
	// (for Protocol Buffers: t implements proto.Message).
	Encodes(t reflect.Type) bool
	// Marshal encodes msg.
	Marshal(msg any) ([]byte, error)
	// Unmarshal decodes payload into the value target points to.
	Unmarshal(payload []byte, target any) error
}

// ContentTypeJSON is the content type of JSON payloads, the default codec's.
// An event without a content type is read as JSON.
const ContentTypeJSON = "application/json"

var codecs struct {
	sync.RWMutex
	list []Codec // consulted in order before JSON
}

// RegisterCodec makes c the codec of the message types it encodes, for
// NewEvent, Decode and the typed handlers (Handle, HandleBatch). Call it at
// start, before events are built or handled. A later registration of the
// same content type replaces the earlier one.
func RegisterCodec(c Codec) {
	codecs.Lock()
	defer codecs.Unlock()
	for i, have := range codecs.list {
		if have.ContentType() == c.ContentType() {
			codecs.list[i] = c
			return
		}
	}
	codecs.list = append(codecs.list, c)
}

// codecFor returns the codec of messages of type t.
func codecFor(t reflect.Type) (Codec, error) {
	codecs.RLock()
	defer codecs.RUnlock()
	for _, c := range codecs.list {
		if c.Encodes(t) {
			return c, nil
		}
	}
	if isProto(t) {
		return nil, fmt.Errorf("%v is a Protocol Buffers message and no codec for it is registered: call ferry.RegisterCodec(ferryproto.Codec{}) once at start (package github.com/ferry-dev/ferry/ferryproto)", t)
	}
	return jsonCodec{}, nil
}

// isProto reports whether t looks like a generated protobuf message (the
// method every one has), so that it is never encoded as JSON by mistake.
func isProto(t reflect.Type) bool {
	_, ok := t.MethodByName("ProtoReflect")
	return ok
}

// NewEvent builds an event whose payload is msg encoded by its codec (JSON
// unless a registered codec encodes msg's type), with the codec's content
// type. ID and CreatedAt are filled in when it is emitted.
func NewEvent(topic, key, eventType string, msg any) (*Event, error) {
	if msg == nil {
		return nil, errors.New("ferry: NewEvent needs a message (nil given); build an Event with a Payload for raw bytes")
	}
	c, err := codecFor(reflect.TypeOf(msg))
	if err != nil {
		return nil, fmt.Errorf("ferry: NewEvent %s: %w", eventType, err)
	}
	payload, err := c.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("ferry: NewEvent %s: encode %T as %s: %w", eventType, msg, c.ContentType(), err)
	}
	return &Event{Topic: topic, Key: key, Type: eventType, ContentType: c.ContentType(), Payload: payload}, nil
}

// Decode decodes ev's payload into a T with the codec of T, after checking
// that ev's content type is that codec's. A mismatch is an error that names
// both. JSON is lenient, as decoding was before codecs: an event without a
// content type, with a JSON one (application/json with parameters,
// anything+json) or with one no registered codec claims is decoded as JSON;
// only an event of another registered codec's type is refused.
func Decode[T any](ev *Event) (T, error) {
	var msg T
	t := reflect.TypeFor[T]()
	c, err := codecFor(t)
	if err != nil {
		return msg, err
	}
	if got := ev.ContentType; !decodes(c, got) {
		return msg, fmt.Errorf("event %s (%s) is %s, but %v is decoded from %s", ev.ID, ev.Type, got, t, c.ContentType())
	}
	if err := c.Unmarshal(ev.Payload, &msg); err != nil {
		return msg, fmt.Errorf("decode %s payload of event %s into %v: %w", ev.Type, ev.ID, t, err)
	}
	return msg, nil
}

// decodes reports whether c reads payloads of content type ct.
func decodes(c Codec, ct string) bool {
	media := ct
	if m, _, err := mime.ParseMediaType(ct); err == nil {
		media = m
	}
	if _, ok := c.(jsonCodec); !ok {
		return media == c.ContentType()
	}
	if media == "" || media == ContentTypeJSON || strings.HasSuffix(media, "+json") {
		return true
	}
	codecs.RLock()
	defer codecs.RUnlock()
	for _, other := range codecs.list {
		if other.ContentType() == media {
			return false
		}
	}
	return true
}

type jsonCodec struct{}

func (jsonCodec) ContentType() string                        { return ContentTypeJSON }
func (jsonCodec) Encodes(reflect.Type) bool                  { return true }
func (jsonCodec) Marshal(msg any) ([]byte, error)            { return json.Marshal(msg) }
func (jsonCodec) Unmarshal(payload []byte, target any) error { return json.Unmarshal(payload, target) }
