// Command orders-kafka is an order service on MariaDB whose events travel
// through Kafka to a consumer group: billing writes an invoice per order,
// exactly once and in order per order, in the same MariaDB. It places
// -orders orders while the relay (which reads the server's binlog) and the
// group run, waits until billing applied every order, prints what it did,
// and exits (non-zero if a count is off).
//
// With the repository's services running (make services starts a MariaDB
// with a row binlog on 127.0.0.1:3307):
//
//	go run ./examples/orders-kafka                        # an in-process Kafka (kfake)
//	go run ./examples/orders-kafka -brokers kafka:9092   # your Kafka
//
// Without -brokers it starts kfake, an in-process cluster that speaks the
// real protocol; with them, topic orders.placed must exist (or the cluster
// create topics on first use). Its tables, Ferry's among them, live in a database of
// their own, dropped at the end (-keep keeps it).
package main

import (
	"context"
	"database/sql"
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

	_ "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"golang.org/x/sync/errgroup"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
)

func main() {
	cfg := config{}
	flag.StringVar(&cfg.databaseURL, "database-url", envOr("DATABASE_URL", "mysql://root@127.0.0.1:3307/"), "the MariaDB server, with a row binlog ($DATABASE_URL); the example creates its own database there")
	brokers := flag.String("brokers", os.Getenv("KAFKA_BROKERS"), "Kafka's seed brokers, comma-separated ($KAFKA_BROKERS); empty: an in-process kfake cluster")
	flag.IntVar(&cfg.orders, "orders", 500, "how many orders to place")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the database to look at it")
	flag.Parse()
	if *brokers != "" {
		cfg.brokers = strings.Split(*brokers, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	invoices, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		log.Fatal(err)
	}
	if invoices != cfg.orders {
		log.Fatalf("expected %d invoices, found %d", cfg.orders, invoices)
	}
}

type config struct {
	databaseURL string
	brokers     []string
	orders      int
	keep        bool
}

type orderPlaced struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

// run returns how many invoices billing wrote.
func run(ctx context.Context, cfg config, out io.Writer) (int, error) {
	if len(cfg.brokers) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders.placed"))
		if err != nil {
			return 0, err
		}
		defer cluster.Close()
		cfg.brokers = cluster.ListenAddrs()
		fmt.Fprintf(out, "kafka: an in-process kfake cluster at %s\n", strings.Join(cfg.brokers, ","))
	}
	name := fmt.Sprintf("orders_example_%d", rand.Int64N(1e9))
	db, drv, err := openDatabase(ctx, cfg, name)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	defer drv.Close()
	quiet := slog.New(slog.DiscardHandler)

	// The relay: outbox (read from the binlog) -> Kafka topic "orders." + topic,
	// keyed by order: each order's events in one partition, in order.
	sink, err := ferrykafka.New(ctx, &ferrykafka.Config{Brokers: cfg.brokers, TopicPrefix: "orders.", Logger: quiet})
	if err != nil {
		return 0, err
	}
	defer sink.Close(context.Background())
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{Logger: quiet})
	if err != nil {
		return 0, err
	}

	// The billing group: a Kafka consumer group into its inbox on MariaDB.
	billing, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Logger: quiet})
	if err != nil {
		return 0, err
	}
	ferry.Handle(billing, "OrderPlaced", func(ctx context.Context, tx *sql.Tx, _ *ferry.Event, o orderPlaced) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO invoices (order_id, amount) VALUES (?, ?)`, o.Order, o.Amount)
		return err
	})
	src, err := ferrykafka.NewSource(ctx, &ferrykafka.SourceConfig{Brokers: cfg.brokers, Group: name + "-billing", Topics: []string{"orders.placed"}, Logger: quiet})
	if err != nil {
		return 0, err
	}

	work, stopWork := context.WithCancel(ctx)
	defer stopWork()
	g, gctx := errgroup.WithContext(work)
	g.Go(func() error { return relay.Run(gctx) })
	g.Go(func() error { return billing.Run(gctx) })
	g.Go(func() error { return billing.Consume(gctx, src) })

	start := time.Now()
	client, err := ferry.NewClient(drv, nil)
	if err != nil {
		return 0, err
	}
	var ids []uuid.UUID
	for i := range cfg.orders {
		o := orderPlaced{Order: fmt.Sprintf("order-%d", i), Amount: 100 + i}
		ev, err := placeOrder(ctx, drv.DB(), client, o)
		if err != nil {
			return 0, err
		}
		ids = append(ids, ev.ID)
	}
	fmt.Fprintf(out, "placed %d orders in %s; relay and group billing running\n", cfg.orders, time.Since(start).Round(time.Millisecond))

	st, waitErr := ferry.AwaitSettled(ctx, drv, "billing", ids, 2*time.Minute)
	if waitErr == nil && !st.Done() {
		waitErr = fmt.Errorf("billing: %d event(s) failed and %d pending after 2 minutes", len(st.Failed), len(st.Pending))
	}
	stopWork()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return 0, err
	}
	if waitErr != nil {
		return 0, waitErr
	}
	var invoices int
	if err := drv.DB().QueryRowContext(ctx, `SELECT count(*) FROM invoices`).Scan(&invoices); err != nil {
		return 0, err
	}
	fmt.Fprintf(out, "billing wrote %d invoices in %s\n", invoices, time.Since(start).Round(time.Millisecond))
	if !cfg.keep {
		_, err = db.ExecContext(context.Background(), "DROP DATABASE "+name)
	}
	return invoices, err
}

// openDatabase creates the example's database on the server and opens
// Ferry's driver on it, migrated, with the service's tables.
func openDatabase(ctx context.Context, cfg config, name string) (*sql.DB, *ferrymysql.Driver, error) {
	dsn, err := ferrymysql.DSNFromURL(cfg.databaseURL)
	if err != nil {
		return nil, nil, err
	}
	db, err := sql.Open("mysql", dsn)
	if err == nil {
		_, err = db.ExecContext(ctx, "CREATE DATABASE "+name)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("create the example's database (is MariaDB running? make services; or set -database-url): %w", err)
	}
	drv, err := ferrymysql.Open(strings.Replace(dsn, ")/", ")/"+name, 1), nil)
	if err == nil {
		_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	}
	if err == nil {
		_, err = drv.DB().ExecContext(ctx, `CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, amount INT NOT NULL) ENGINE=InnoDB`)
	}
	if err == nil {
		_, err = drv.DB().ExecContext(ctx, `CREATE TABLE invoices (order_id VARCHAR(64) PRIMARY KEY, amount INT NOT NULL) ENGINE=InnoDB`)
	}
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, drv, nil
}

// placeOrder writes an order and its event in one transaction.
func placeOrder(ctx context.Context, db *sql.DB, client *ferry.Client[*sql.Tx], o orderPlaced) (*ferry.Event, error) {
	ev, err := ferry.NewEvent("placed", o.Order, "OrderPlaced", o)
	if err != nil {
		return nil, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES (?, ?)`, o.Order, o.Amount); err != nil {
		return nil, err
	}
	if err := client.EmitTx(ctx, tx, ev); err != nil {
		return nil, err
	}
	return ev, tx.Commit()
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
