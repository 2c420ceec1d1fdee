package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
)

// TestPublishesEveryOrder: the service's events reach the stream, each
// once.
func TestPublishesEveryOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := os.Getenv("FERRY_TEST_MYSQL_URL")
	if url == "" {
		url = "mysql://root@127.0.0.1:3307/"
	}
	dsn, err := ferrymysql.DSNFromURL(url)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", dsn)
	if err == nil {
		err = admin.PingContext(ctx)
	}
	if err != nil {
		unavailable(t, "MariaDB (with a row binlog)", "FERRY_TEST_MYSQL_URL", err)
	}
	defer admin.Close()
	name := fmt.Sprintf("program_%d", rand.Int64N(1e12))
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	defer admin.Exec("DROP DATABASE " + name)
	dsn = strings.Replace(dsn, ")/", ")/"+name, 1)

	natsURL := os.Getenv("FERRY_TEST_NATS_URL")
	if natsURL == "" {
		natsURL = nats.DefaultURL
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		unavailable(t, "NATS (JetStream)", "FERRY_TEST_NATS_URL", err)
	}
	defer nc.Close()
	stream := strings.ToUpper(name)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), stream)

	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{name + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer msgs.Stop()
	context.AfterFunc(ctx, msgs.Stop) // Next returns when the minute is up

	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	go func() { done <- run(rctx, dsn, nc, stream, name, 10) }()
	got := map[string]int{}
	for len(got) < 10 {
		m, err := msgs.Next()
		if err != nil {
			t.Fatalf("after %d of 10 orders' events: %v", len(got), err)
		}
		got[m.Headers().Get("ce-subject")]++ // the event's key
	}
	stop()
	if err := <-done; err != nil && rctx.Err() == nil {
		t.Fatal(err)
	}
	for key, n := range got {
		if n != 1 {
			t.Errorf("order %s's event was published %d times", key, n)
		}
	}
}

// unavailable skips a test whose service is absent, or fails it under
// CI=true.
func unavailable(t *testing.T, service, env string, err error) {
	msg := fmt.Sprintf("%s is not reachable (%v): set %s to a server to run this test", service, err, env)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
