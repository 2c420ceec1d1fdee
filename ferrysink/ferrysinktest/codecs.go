package ferrysinktest

import (
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryproto"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// codecOrder is the JSON message of testCodecs.
type codecOrder struct {
	Order string   `json:"order"`
	Lines []string `json:"lines"`
	Total float64  `json:"total"`
}

// testCodecs publishes events built by ferry.NewEvent with each codec (JSON
// and Protocol Buffers), reads them back from the destination, and decodes
// them into the types they were built from: the content type and the
// payload's bytes survive the wire.
func testCodecs(t *testing.T, h Harness) {
	ferry.RegisterCodec(ferryproto.Codec{})
	ctx := testContext(t)
	sink, read := newSink(t, h)

	order := codecOrder{Order: "o-1", Lines: []string{"tea", "ünïcode"}, Total: 12.5}
	jev, err := ferry.NewEvent("codecs", "o-1", "OrderPlaced", order)
	require.NoError(t, err)
	msg, err := structpb.NewStruct(map[string]any{"order": "o-1", "lines": []any{"tea", "ünïcode"}, "total": 12.5, "empty": nil})
	require.NoError(t, err)
	pev, err := ferry.NewEvent("codecs", "o-1", "OrderPlaced", msg)
	require.NoError(t, err)
	sent := []*ferryevent.Event{jev, pev}
	for i, ev := range sent {
		require.NoError(t, ferryevent.Prepare(ev, i, 0, time.Now()))
		ev.Seq = int64(i + 1)
	}
	for _, ev := range sent { // one event per call, as the relay sends a key's events
		requireAllPublished(t, publish(ctx, t, sink, []*ferryevent.Event{ev}), []*ferryevent.Event{ev})
	}

	byID := storedByID(t, readAll(ctx, t, read))
	require.Len(t, byID, 2)
	gotJSON := byID[jev.ID]
	require.NotNil(t, gotJSON, "the JSON event is stored")
	require.Equal(t, ferry.ContentTypeJSON, gotJSON.ContentType)
	back, err := ferry.Decode[codecOrder](gotJSON)
	require.NoError(t, err)
	require.Equal(t, order, back)

	gotProto := byID[pev.ID]
	require.NotNil(t, gotProto, "the protobuf event is stored")
	require.Equal(t, ferryproto.ContentType, gotProto.ContentType)
	require.Equal(t, pev.Payload, gotProto.Payload, "the binary payload survives byte for byte")
	msgBack, err := ferry.Decode[*structpb.Struct](gotProto)
	require.NoError(t, err)
	require.True(t, proto.Equal(msg, msgBack), "decoded %v, sent %v", msgBack, msg)

	_, err = ferry.Decode[codecOrder](gotProto)
	require.ErrorContains(t, err, "is application/x-protobuf", "a handler of the other codec refuses it")
}
