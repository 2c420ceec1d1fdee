// Command mariadb-jetstream is a service on MariaDB that tells the rest of
// the system about its orders through NATS JetStream: each order and its
// event commit in one transaction, and the relay, which reads the server's
// binlog, publishes the events to subject orders.orders of a stream, each
// order's in order. It places -orders orders, then relays until it is
// stopped.
//
//	go run . -database-url mysql://app:secret@localhost:3306/app -nats-url nats://localhost:4222
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
)

func main() {
	url := flag.String("database-url", os.Getenv("DATABASE_URL"), "the MariaDB database, mysql://user:password@host:3306/db (default $DATABASE_URL)")
	natsURL := flag.String("nats-url", nats.DefaultURL, "the NATS server")
	stream := flag.String("stream", "ORDERS", "the JetStream stream (created if missing)")
	orders := flag.Int("orders", 10, "how many orders to place before relaying")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dsn, err := ferrymysql.DSNFromURL(*url)
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(*natsURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	if err := run(ctx, dsn, nc, *stream, "orders", *orders); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

// run places orders, each in a transaction with its OrderPlaced event, and
// relays the outbox to the stream until ctx ends.
func run(ctx context.Context, dsn string, nc *nats.Conn, stream, prefix string, orders int) error {
	drv, err := ferrymysql.Open(dsn, nil)
	if err != nil {
		return err
	}
	defer drv.Close()
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		return err
	}
	db := drv.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id VARCHAR(64) PRIMARY KEY, amount INT NOT NULL) ENGINE=InnoDB`); err != nil {
		return err
	}
	client, err := ferry.NewClient(drv, nil)
	if err != nil {
		return err
	}
	for i := range orders {
		if err := placeOrder(ctx, db, client, fmt.Sprintf("order-%d", i), 100+i); err != nil {
			return err
		}
	}
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
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

// placeOrder writes an order and its event in one transaction.
func placeOrder(ctx context.Context, db *sql.DB, client *ferry.Client[*sql.Tx], id string, amount int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES (?, ?)`, id, amount); err != nil {
		return err
	}
	if err := client.EmitTx(ctx, tx, &ferry.Event{Topic: "orders", Key: id, Type: "OrderPlaced", Payload: fmt.Appendf(nil, `{"id":%q,"amount":%d}`, id, amount)}); err != nil {
		return err
	}
	return tx.Commit()
}
