// Command sqlite-webhook is a service on Ferry's embedded defaults: its
// orders and their events in a SQLite file, the events delivered to an
// HTTP endpoint, signed. It places -orders orders, then relays until it is
// stopped.
//
//	go run . -db orders.db -url https://example.com/hooks -secret "$WEBHOOK_SECRET"
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

func main() {
	db := flag.String("db", "orders.db", "the SQLite file of the orders and the outbox")
	url := flag.String("url", "", "the endpoint the events are POSTed to")
	secret := flag.String("secret", os.Getenv("WEBHOOK_SECRET"), "the key the events are signed with (default $WEBHOOK_SECRET)")
	orders := flag.Int("orders", 10, "how many orders to place before relaying")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *db, *url, *secret, *orders); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

// run places orders, each in a transaction with its OrderPlaced event, and
// relays the outbox to url until ctx ends.
func run(ctx context.Context, path, url, secret string, orders int) error {
	drv, err := ferrysqlite.Open(path, nil)
	if err != nil {
		return err
	}
	defer drv.Close()
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		return err
	}
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		return err
	}
	client, err := ferry.NewClient(drv, nil)
	if err != nil {
		return err
	}
	for i := range orders {
		tx, err := drv.DB().BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		id := fmt.Sprintf("order-%d", i)
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES (?, ?)`, id, 100+i); err != nil {
			_ = tx.Rollback()
			return err
		}
		err = client.EmitTx(ctx, tx, &ferry.Event{Topic: "orders", Key: id, Type: "OrderPlaced", Payload: fmt.Appendf(nil, `{"id":%q,"amount":%d}`, id, 100+i)})
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	sink, err := ferrywebhook.New(&ferrywebhook.Config{URL: url, Secrets: []string{secret}})
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
