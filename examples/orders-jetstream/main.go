// Command orders-jetstream is an order service on PostgreSQL whose events
// travel through NATS JetStream to two consumer groups: billing writes an
// invoice per order, shipping a shipment per order, each exactly once and
// in order per order. It places -orders orders while the relay and both
// groups run, waits until both groups applied every order, prints what
// each did, and exits (non-zero if a count is off).
//
// With the repository's services running (make services):
//
//	go run ./examples/orders-jetstream
//
// Its tables, Ferry's among them, live in a schema of their own, dropped at
// the end (-keep keeps it), and its stream is deleted likewise.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
)

func main() {
	cfg := config{}
	flag.StringVar(&cfg.databaseURL, "database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "the PostgreSQL database ($DATABASE_URL)")
	flag.StringVar(&cfg.natsURL, "nats-url", envOr("NATS_URL", nats.DefaultURL), "the NATS server, with JetStream ($NATS_URL)")
	flag.IntVar(&cfg.orders, "orders", 500, "how many orders to place")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the schema and the stream to look at them")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		log.Fatal(err)
	}
	if res.invoices != cfg.orders || res.shipments != cfg.orders {
		log.Fatalf("expected %d invoices and shipments, found %d and %d", cfg.orders, res.invoices, res.shipments)
	}
}

type config struct {
	databaseURL, natsURL string
	orders               int
	keep                 bool
}

type result struct{ invoices, shipments int }

type orderPlaced struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

func run(ctx context.Context, cfg config, out io.Writer) (result, error) {
	name := fmt.Sprintf("orders_example_%d", rand.Int64N(1e9))
	pool, err := pgxpool.New(ctx, cfg.databaseURL)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	nc, err := nats.Connect(cfg.natsURL, ferrynats.WriteFence()) // fences the relay's writes by its lease
	if err != nil {
		return result{}, fmt.Errorf("connect to NATS at %s (start it with make services, or set -nats-url): %w", cfg.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return result{}, err
	}

	// The service's tables and Ferry's, in a schema of their own.
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+name+`;
		CREATE TABLE `+name+`.orders (id text PRIMARY KEY, amount int NOT NULL);
		CREATE TABLE `+name+`.invoices (order_id text PRIMARY KEY, amount int NOT NULL);
		CREATE TABLE `+name+`.shipments (order_id text PRIMARY KEY, seq bigint NOT NULL)`); err != nil {
		return result{}, fmt.Errorf("create the example's schema (is PostgreSQL running? make services; or set -database-url): %w", err)
	}
	stream := strings.ToUpper(name)
	if !cfg.keep {
		defer func() {
			_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+name+` CASCADE`)
			_ = js.DeleteStream(context.Background(), stream)
		}()
	}
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: name})
	if err != nil {
		return result{}, err
	}
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		return result{}, err
	}
	quiet := slog.New(slog.DiscardHandler)

	// The relay: outbox -> JetStream, subjects orders.<topic>.
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: stream, SubjectPrefix: "orders", CreateStream: true})
	if err != nil {
		return result{}, err
	}
	defer sink.Close(context.Background())
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{Logger: quiet})
	if err != nil {
		return result{}, err
	}

	// Two consumer groups, each with its own durable on the stream and its
	// own inbox rows: each applies every order once.
	billing, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Logger: quiet})
	if err != nil {
		return result{}, err
	}
	ferry.Handle(billing, "OrderPlaced", func(ctx context.Context, tx pgx.Tx, _ *ferry.Event, o orderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+name+`.invoices (order_id, amount) VALUES ($1, $2)`, o.Order, o.Amount)
		return err
	})
	shipping, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "shipping", Logger: quiet})
	if err != nil {
		return result{}, err
	}
	ferry.Handle(shipping, "OrderPlaced", func(ctx context.Context, tx pgx.Tx, ev *ferry.Event, o orderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+name+`.shipments (order_id, seq) VALUES ($1, $2)`, o.Order, ev.Seq)
		return err
	})

	work, stopWork := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(work)
	g.Go(func() error { return relay.Run(gctx) })
	for _, c := range []*ferry.Consumer[pgx.Tx]{billing, shipping} {
		src, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{Stream: stream, Durable: c.Group(), SubjectPrefix: "orders", Logger: quiet})
		if err != nil {
			stopWork()
			return result{}, err
		}
		g.Go(func() error { return c.Run(gctx) })
		g.Go(func() error { return c.Consume(gctx, src) })
	}

	start := time.Now()
	client, err := ferry.NewClient(drv, nil)
	if err != nil {
		stopWork()
		return result{}, err
	}
	var ids []uuid.UUID
	for i := range cfg.orders {
		o := orderPlaced{Order: fmt.Sprintf("order-%d", i), Amount: 100 + i}
		ev, err := ferry.NewEvent("placed", o.Order, "OrderPlaced", o)
		if err != nil {
			stopWork()
			return result{}, err
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+name+`.orders (id, amount) VALUES ($1, $2)`, o.Order, o.Amount); err != nil {
				return err
			}
			return client.EmitTx(ctx, tx, ev)
		})
		if err != nil {
			stopWork()
			return result{}, err
		}
		ids = append(ids, ev.ID)
	}
	fmt.Fprintf(out, "placed %d orders in %s; relay and groups billing, shipping running\n", cfg.orders, time.Since(start).Round(time.Millisecond))

	// Wait until both groups applied every order: woken by the database
	// as events finish, without polling.
	waitErr := settled(ctx, drv, ids, "billing", "shipping")
	stopWork()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return result{}, err
	}
	if waitErr != nil {
		return result{}, waitErr
	}
	var res result
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+name+`.invoices), (SELECT count(*) FROM `+name+`.shipments)`).Scan(&res.invoices, &res.shipments); err != nil {
		return result{}, err
	}
	fmt.Fprintf(out, "billing wrote %d invoices, shipping %d shipments, in %s\n", res.invoices, res.shipments, time.Since(start).Round(time.Millisecond))
	return res, nil
}

// settled waits until each group processed every event of ids.
func settled(ctx context.Context, drv ferrydriver.Settler, ids []uuid.UUID, groups ...string) error {
	for _, group := range groups {
		st, err := ferry.AwaitSettled(ctx, drv, group, ids, 2*time.Minute)
		if err != nil {
			return err
		}
		if !st.Done() {
			return fmt.Errorf("group %s: %d event(s) failed and %d pending after 2 minutes", group, len(st.Failed), len(st.Pending))
		}
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
