package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPublishesEveryOrder: the service's events reach Kafka (franz-go's
// kfake, which speaks the protocol), each once, each order's keyed by it.
func TestPublishesEveryOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := os.Getenv("FERRY_TEST_PG_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		unavailable(t, "PostgreSQL", "FERRY_TEST_PG_URL", err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("program_%d", rand.Int64N(1e12))
	defer pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	go func() { done <- run(rctx, pool, schema, cluster.ListenAddrs(), 10) }()

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	got := map[string]int{}
	for len(got) < 10 {
		fetches := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("10 orders' events were not published within a minute: %v", got)
		}
		fetches.EachRecord(func(r *kgo.Record) { got[string(r.Key)]++ })
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
