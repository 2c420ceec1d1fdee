package ferry_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryproto"
	"github.com/ferry-dev/ferry/ferrytest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func init() { ferry.RegisterCodec(ferryproto.Codec{}) }

type shipped struct {
	Order string `json:"order"`
	Boxes int    `json:"boxes"`
}

func TestNewEventAndDecodeRoundTripBothCodecs(t *testing.T) {
	t.Parallel()
	ev, err := ferry.NewEvent("orders", "o-1", "OrderShipped", shipped{Order: "o-1", Boxes: 2})
	require.NoError(t, err)
	require.Equal(t, ferry.ContentTypeJSON, ev.ContentType)
	require.JSONEq(t, `{"order":"o-1","boxes":2}`, string(ev.Payload))
	got, err := ferry.Decode[shipped](ev)
	require.NoError(t, err)
	require.Equal(t, shipped{Order: "o-1", Boxes: 2}, got)

	msg, err := structpb.NewStruct(map[string]any{"order": "o-1", "boxes": 2})
	require.NoError(t, err)
	pev, err := ferry.NewEvent("orders", "o-1", "OrderShipped", msg)
	require.NoError(t, err)
	require.Equal(t, ferryproto.ContentType, pev.ContentType)
	back, err := ferry.Decode[*structpb.Struct](pev)
	require.NoError(t, err)
	require.True(t, proto.Equal(msg, back), "decoded %v, sent %v", back, msg)

	// An event without a content type is JSON, as every event emitted
	// before codecs was.
	legacy := &ferry.Event{Type: "OrderShipped", Payload: []byte(`{"order":"o-2","boxes":1}`)}
	got, err = ferry.Decode[shipped](legacy)
	require.NoError(t, err)
	require.Equal(t, "o-2", got.Order)
}

func TestDecodeRefusesTheOtherCodec(t *testing.T) {
	t.Parallel()
	jev, err := ferry.NewEvent("orders", "o-1", "OrderShipped", shipped{Order: "o-1"})
	require.NoError(t, err)
	_, err = ferry.Decode[*wrapperspb.StringValue](jev)
	require.ErrorContains(t, err, "is application/json, but *wrapperspb.StringValue is decoded from application/x-protobuf")

	pev, err := ferry.NewEvent("orders", "o-1", "OrderShipped", wrapperspb.String("o-1"))
	require.NoError(t, err)
	_, err = ferry.Decode[shipped](pev)
	require.ErrorContains(t, err, "is application/x-protobuf, but ferry_test.shipped is decoded from application/json")

	// JSON is read as leniently as before codecs: parameters, +json types
	// and types no registered codec claims.
	for _, ct := range []string{"application/json; charset=utf-8", "application/cloudevents+json", "text/plain"} {
		got, err := ferry.Decode[shipped](&ferry.Event{Type: "OrderShipped", ContentType: ct, Payload: []byte(`{"order":"o-3"}`)})
		require.NoError(t, err, ct)
		require.Equal(t, "o-3", got.Order, ct)
	}
	_, err = ferry.Decode[*wrapperspb.StringValue](&ferry.Event{Type: "Named", ContentType: "application/x-protobuf; proto=x", Payload: []byte{}})
	require.NoError(t, err, "a protobuf content type with parameters")

	_, err = ferry.NewEvent("orders", "o-1", "OrderShipped", nil)
	require.ErrorContains(t, err, "needs a message")
}

// A typed handler decodes by the event's content type and sends an event
// it cannot decode to DEAD at once, with a reason that names both types.
func TestHandleDecodesByContentType(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "codecs", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var names []string
	ferry.Handle(c, "Named", func(ctx context.Context, tx pgx.Tx, ev *ferry.Event, msg *wrapperspb.StringValue) error {
		names = append(names, msg.GetValue())
		return nil
	})
	consumer := ferrytest.NewConsumer(t, c, drv)

	ev, err := ferry.NewEvent("names", "n-1", "Named", wrapperspb.String("ada"))
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessed, consumer.Deliver(ev).State)
	require.Equal(t, []string{"ada"}, names)

	wrong, err := ferry.NewEvent("names", "n-2", "Named", map[string]string{"value": "bob"})
	require.NoError(t, err)
	got := consumer.Deliver(wrong)
	require.Equal(t, ferrydriver.InboxDead, got.State, "a payload of the wrong codec is not retried")
	require.Equal(t, 1, got.Attempts)
	require.Contains(t, got.Error, "is application/json, but *wrapperspb.StringValue is decoded from application/x-protobuf")
	require.Equal(t, []string{"ada"}, names)
}
