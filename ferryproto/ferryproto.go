// Package ferryproto is Ferry's Protocol Buffers codec. Register it once at
// start and events built from a proto.Message (ferry.NewEvent) carry its
// binary encoding with the content type application/x-protobuf, and typed
// handlers taking a message (ferry.Handle with a *yourpb.OrderPlaced)
// decode it, refusing an event of another content type:
//
//	ferry.RegisterCodec(ferryproto.Codec{})
//
// It lives in its own package so that only services that use Protocol
// Buffers compile google.golang.org/protobuf.
package ferryproto

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/ferry-dev/ferry"
	"google.golang.org/protobuf/proto"
)

// ContentType is the content type of the events this codec encodes.
const ContentType = "application/x-protobuf"

// Codec encodes proto.Message values (deterministically: one message, one
// payload) and decodes them.
type Codec struct{}

var _ ferry.Codec = Codec{}

var messageType = reflect.TypeFor[proto.Message]()

// ContentType implements ferry.Codec.
func (Codec) ContentType() string { return ContentType }

// Encodes implements ferry.Codec: t implements proto.Message.
func (Codec) Encodes(t reflect.Type) bool { return t != nil && t.Implements(messageType) }

// Marshal implements ferry.Codec.
func (Codec) Marshal(msg any) ([]byte, error) {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("ferryproto: %T is not a proto.Message", msg)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// Unmarshal implements ferry.Codec. target points to a message pointer
// (allocated when nil), or is a message itself.
func (Codec) Unmarshal(payload []byte, target any) error {
	if m, ok := target.(proto.Message); ok {
		return proto.Unmarshal(payload, m)
	}
	v := reflect.ValueOf(target)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Pointer {
		return fmt.Errorf("ferryproto: decode into %T: want a pointer to a message pointer", target)
	}
	e := v.Elem()
	if e.IsNil() {
		e.Set(reflect.New(e.Type().Elem()))
	}
	m, ok := e.Interface().(proto.Message)
	if !ok {
		return errors.New("ferryproto: decode into " + e.Type().String() + ": not a proto.Message")
	}
	return proto.Unmarshal(payload, m)
}
