package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
)

// TestBillingAppliesEveryOrderOnce runs the example against the local
// MariaDB, through an in-process Kafka: billing applies every order once.
func TestBillingAppliesEveryOrderOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := config{databaseURL: envOr("FERRY_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3307/"), orders: 120}
	dsn, err := ferrymysql.DSNFromURL(cfg.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err == nil {
		err = db.PingContext(ctx)
		db.Close()
	}
	if err != nil {
		unavailable(t, "MariaDB (with a row binlog)", "FERRY_TEST_MYSQL_URL", err)
	}
	invoices, err := run(ctx, cfg, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	if invoices != cfg.orders {
		t.Fatalf("%d orders: %d invoices", cfg.orders, invoices)
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
