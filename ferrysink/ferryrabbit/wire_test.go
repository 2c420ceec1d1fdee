package ferryrabbit_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
)

// delivery builds a delivery carrying the attributes of a valid event with
// the given prefix, plus extra headers.
func delivery(prefix string, id uuid.UUID, extra amqp.Table) amqp.Delivery {
	h := amqp.Table{
		prefix + "specversion": "1.0",
		prefix + "id":          id.String(),
		prefix + "source":      "billing",
		prefix + "type":        "InvoicePaid",
		prefix + "subject":     "invoice-9",
		prefix + "time":        "2025-03-30T01:59:58.123456Z",
		prefix + "ferrytopic":  "invoices",
	}
	for k, v := range extra {
		h[k] = v
	}
	return amqp.Delivery{Headers: h, ContentType: "application/json", Body: []byte(`{"total":12}`)}
}

func TestDecode(t *testing.T) {
	t.Parallel()
	id := ferryevent.NewID()
	ev, err := ferryrabbit.Decode(delivery("cloudEvents_", id, amqp.Table{
		"cloudEvents_ferrykeyseq":  "3",
		"traceparent":              "00-abc-01",
		"cloudEvents_partitionkey": "p-1", // an extension attribute: a header like any other
		"x-death":                  []any{amqp.Table{"count": int64(1)}},
		"x-delivery-count":         int64(2),
		"x-first-death-reason":     "rejected",
		"x-binary":                 []byte("skipped: not a string"),
	}))
	require.NoError(t, err)
	require.Equal(t, ferryevent.Event{
		ID:          id,
		Topic:       "invoices",
		Key:         "invoice-9",
		Type:        "InvoicePaid",
		Source:      "billing",
		Headers:     map[string]string{"traceparent": "00-abc-01", "cloudEvents_partitionkey": "p-1"},
		ContentType: "application/json",
		Payload:     []byte(`{"total":12}`),
		CreatedAt:   time.Date(2025, 3, 30, 1, 59, 58, 123456000, time.UTC),
		Seq:         3,
	}, ev)
}

// TestDecodeColonPrefix reads a message that uses the binding's other
// prefix, with native AMQP values, as the binding allows.
func TestDecodeColonPrefix(t *testing.T) {
	t.Parallel()
	id := ferryevent.NewID()
	created := time.Date(2025, 3, 30, 1, 59, 58, 0, time.UTC)
	d := delivery("cloudEvents:", id, amqp.Table{
		"cloudEvents:time":        created, // an AMQP timestamp
		"cloudEvents:ferrykeyseq": int64(12),
	})
	d.ContentType = ""
	d.Headers["cloudEvents:datacontenttype"] = "text/plain"
	ev, err := ferryrabbit.Decode(d)
	require.NoError(t, err)
	require.Equal(t, id, ev.ID)
	require.True(t, created.Equal(ev.CreatedAt))
	require.Equal(t, int64(12), ev.Seq)
	require.Equal(t, "text/plain", ev.ContentType)
	require.Empty(t, ev.Headers)
}

func TestDecodeMalformed(t *testing.T) {
	t.Parallel()
	id := ferryevent.NewID()
	for _, tc := range []struct {
		name string
		d    amqp.Delivery
		want string
	}{
		{"no headers", amqp.Delivery{Body: []byte("x")}, "header cloudEvents_specversion is missing"},
		{"other spec version", delivery("cloudEvents_", id, amqp.Table{"cloudEvents_specversion": "0.3"}), `specversion "0.3"`},
		{"bad id", delivery("cloudEvents_", id, amqp.Table{"cloudEvents_id": "42"}), `header cloudEvents_id: "42" is not a UUID`},
		{"no topic", delivery("cloudEvents_", id, amqp.Table{"cloudEvents_ferrytopic": ""}), "header cloudEvents_ferrytopic is missing"},
		{"bad time", delivery("cloudEvents_", id, amqp.Table{"cloudEvents_time": "yesterday"}), "not an RFC 3339 time"},
		{"bad seq", delivery("cloudEvents_", id, amqp.Table{"cloudEvents_ferrykeyseq": int64(-1)}), "not a positive integer"},
		{"table as attribute", delivery("cloudEvents_", id, amqp.Table{"cloudEvents_type": amqp.Table{}}), "header cloudEvents_type is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ferryrabbit.Decode(tc.d)
			require.ErrorIs(t, err, ferryrabbit.ErrMalformed)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
