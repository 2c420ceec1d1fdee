package ferryotel_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryotel/ferryoteltest"
	"github.com/ferry-dev/ferry/ferrysink"
)

func TestMain(m *testing.M) { ferrypgtest.Main(m) }

// TestOneTraceFromRequestToHandler: the direct path, outbox → relay →
// inbox sink → handler. The broker paths (JetStream, Kafka, RabbitMQ,
// webhooks) run in cmd/ferry, which has every sink.
func TestOneTraceFromRequestToHandler(t *testing.T) {
	t.Parallel()
	ferryoteltest.Exercise(t, ferryoteltest.Pipeline{System: "ferry", Wire: func(_ *testing.T, _ context.Context, c *ferry.Consumer[pgx.Tx]) (ferrysink.Sink, ferrysink.Source) {
		return c.Sink(), nil
	}})
}
