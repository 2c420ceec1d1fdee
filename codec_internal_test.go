package ferry

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A protobuf message is never encoded as JSON by mistake: without its codec
// registered, NewEvent and Decode say which codec to register.
func TestAProtoMessageNeedsItsCodec(t *testing.T) {
	codecs.Lock()
	saved := codecs.list
	codecs.list = nil
	codecs.Unlock()
	t.Cleanup(func() {
		codecs.Lock()
		codecs.list = saved
		codecs.Unlock()
	})

	_, err := NewEvent("t", "k", "Named", wrapperspb.String("x"))
	require.ErrorContains(t, err, "ferry.RegisterCodec(ferryproto.Codec{})")
	_, err = Decode[*wrapperspb.StringValue](&Event{Type: "Named", ContentType: "application/x-protobuf"})
	require.ErrorContains(t, err, "no codec for it is registered")
}
