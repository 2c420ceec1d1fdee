package ferrypg

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
)

// BenchmarkDeliveryLatency: an Ingest's call to its handler's, one event
// every 5 ms, with the ingest's claims and without
// (ferrydrivertest.BenchDeliveryLatency).
//
//	cd ferrydriver/ferrypg && go test -run '^$' -bench DeliveryLatency -benchtime 2000x
func BenchmarkDeliveryLatency(b *testing.B) {
	ferrydrivertest.BenchDeliveryLatency(b, func(b *testing.B) ferrydriver.Inbox[pgx.Tx] { return newTestDriver(b) })
}
