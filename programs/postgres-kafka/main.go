// Command postgres-kafka is a service on PostgreSQL that tells the rest of
// the system about its orders through Kafka: each order and its event
// commit in one transaction, and the relay publishes the events to topic
// "orders", keyed by order (each order's events in one partition, in
// order). It places -orders orders, then relays until it is stopped.
//
//	go run . -database-url postgres://app@localhost:5432/app -brokers localhost:9092
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
)

func main() {
	url := flag.String("database-url", os.Getenv("DATABASE_URL"), "the PostgreSQL database (default $DATABASE_URL)")
	schema := flag.String("schema", "ferry", "the schema of Ferry's tables")
	brokers := flag.String("brokers", "localhost:9092", "Kafka's seed brokers, comma-separated")
	orders := flag.Int("orders", 10, "how many orders to place before relaying")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, *url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := run(ctx, pool, *schema, strings.Split(*brokers, ","), *orders); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

// run places orders, each in a transaction with its OrderPlaced event, and
// relays the outbox to Kafka until ctx ends.
func run(ctx context.Context, pool *pgxpool.Pool, schema string, brokers []string, orders int) error {
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema})
	if err != nil {
		return err
	}
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+schema+`.orders (id text PRIMARY KEY, amount int NOT NULL)`); err != nil {
		return err
	}
	client, err := ferry.NewClient(drv, nil)
	if err != nil {
		return err
	}
	for i := range orders {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		id := fmt.Sprintf("order-%d", i)
		_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.orders (id, amount) VALUES ($1, $2)`, id, 100+i)
		if err == nil {
			err = client.EmitTx(ctx, tx, &ferry.Event{Topic: "orders", Key: id, Type: "OrderPlaced", Payload: fmt.Appendf(nil, `{"id":%q,"amount":%d}`, id, 100+i)})
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
	}
	sink, err := ferrykafka.New(ctx, &ferrykafka.Config{Brokers: brokers})
	if err != nil {
		return err
	}
	defer sink.Close(context.Background())
	relay, err := ferry.NewRelay(drv, sink, nil)
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}
