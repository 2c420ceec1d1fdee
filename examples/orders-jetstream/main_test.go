package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
)

// TestBothGroupsApplyEveryOrderOnce runs the example against the local
// services: each group applies every order exactly once.
func TestBothGroupsApplyEveryOrderOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := config{databaseURL: envOr("FERRY_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		natsURL: envOr("FERRY_TEST_NATS_URL", nats.DefaultURL), orders: 120}
	if conn, err := pgx.Connect(ctx, cfg.databaseURL); err != nil {
		unavailable(t, "PostgreSQL", "FERRY_TEST_PG_URL", err)
	} else {
		conn.Close(ctx)
	}
	if nc, err := nats.Connect(cfg.natsURL); err != nil {
		unavailable(t, "NATS (JetStream)", "FERRY_TEST_NATS_URL", err)
	} else {
		nc.Close()
	}
	res, err := run(ctx, cfg, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	if res.invoices != cfg.orders || res.shipments != cfg.orders {
		t.Fatalf("%d orders: %d invoices, %d shipments", cfg.orders, res.invoices, res.shipments)
	}
}

// testLog writes the example's progress to the test's log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func unavailable(t *testing.T, service, env string, err error) {
	msg := fmt.Sprintf("%s is not reachable (%v): set %s to a server to run this test", service, err, env)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
