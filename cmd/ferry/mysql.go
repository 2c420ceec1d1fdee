package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
)

// isMySQLURL reports a mysql:// (or mariadb://) database URL.
func isMySQLURL(u string) bool {
	return strings.HasPrefix(u, "mysql://") || strings.HasPrefix(u, "mariadb://")
}

// openMySQL opens the database of a mysql:// URL
// (mysql://user:password@host:3306/app): Ferry's tables live in its
// database.
func (d *dbFlags) openMySQL(ctx context.Context) (*backend, error) {
	dsn, err := ferrymysql.DSNFromURL(d.url)
	if err != nil {
		return nil, usagef("--database-url / FERRY_DATABASE_URL: %v", err)
	}
	drv, err := ferrymysql.Open(dsn, &ferrymysql.Config{Partitions: d.partitions, Logger: d.logger()})
	if err != nil {
		return nil, fmt.Errorf("cannot reach MySQL at --database-url / FERRY_DATABASE_URL (%s): %w", redactMySQL(dsn), err)
	}
	emit, err := emitter(drv)
	if err != nil {
		_ = drv.Close()
		return nil, err
	}
	return &backend{
		name: "mysql", label: "database " + drv.Schema(), store: drv, inbox: drv, emit: emit, chainInbox: chainInboxFor(drv),
		ping:  func(ctx context.Context) error { return drv.DB().PingContext(ctx) },
		close: func() { _ = drv.Close() },
	}, nil
}

// redactMySQL hides a DSN's password.
func redactMySQL(dsn string) string {
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "(a DSN)"
	}
	if c.Passwd != "" {
		c.Passwd = "***"
	}
	return c.FormatDSN()
}

// benchRun is what a bench run measures.
type benchRun struct {
	events, keys, batch, rate, producers int
	workers, consumerBatch               int
	modes                                []string
	duration, poll                       time.Duration
	keep                                 bool
}

// benchMySQL runs drain, latency, consume and settle on MySQL: in a fresh
// database of the server the URL names, removed after the run unless kept.
func benchMySQL(ctx context.Context, stdout, stderr io.Writer, mode string, db *dbFlags, natsURL string, r benchRun) error {
	if mode != "drain" && mode != "latency" && mode != "consume" && mode != "settle" {
		return usagef("ferry bench %s does not run on MySQL yet: drain, latency, consume and settle do", mode)
	}
	dsn, err := ferrymysql.DSNFromURL(db.url)
	if err != nil {
		return usagef("--database-url / FERRY_DATABASE_URL: %v", err)
	}
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		return usagef("--database-url / FERRY_DATABASE_URL: %v", err)
	}
	c.DBName = ""
	admin, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		return err
	}
	defer admin.Close()
	name := fmt.Sprintf("ferrybench_%d", time.Now().UnixNano()%1e9)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return fmt.Errorf("create the bench's database on --database-url: %w", err)
	}
	defer func() {
		if !r.keep {
			_, _ = admin.ExecContext(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+name)
		}
	}()
	c.DBName = name
	drv, err := ferrymysql.Open(c.FormatDSN(), nil)
	if err != nil {
		return err
	}
	defer drv.Close()
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		return err
	}
	var version string
	_ = drv.DB().QueryRowContext(ctx, "SELECT VERSION()").Scan(&version)
	if mode == "consume" || mode == "settle" {
		fmt.Fprintf(stdout, "ferry bench %s: MySQL %s, GOMAXPROCS %d, workers %d, keys %d\n", mode, version, runtime.GOMAXPROCS(0), r.workers, r.keys)
		if mode == "consume" {
			return benchConsume(ctx, stdout, mysqlBench(drv), r.events, r.keys, r.workers, r.consumerBatch, r.modes)
		}
		return benchSettle(ctx, stdout, mysqlBench(drv), r.events, r.keys, r.workers, r.rate)
	}
	bs, err := openBenchStream(ctx, natsURL, r.keep)
	if err != nil {
		return err
	}
	defer bs.close()
	client, err := ferry.NewClient(drv, nil)
	if err != nil {
		return err
	}
	relay, err := ferry.NewRelay(drv, bs.sink, &ferry.RelayConfig{BatchSize: r.batch, PollInterval: r.poll,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ferry bench %s: MySQL %s, NATS %s, GOMAXPROCS %d, batch %d, keys %d\n", mode, version, bs.nc.ConnectedServerVersion(),
		runtime.GOMAXPROCS(0), r.batch, r.keys)
	if mode == "drain" {
		return benchDrain(ctx, stdout, client, relay, bs.js, bs.stream, r.events, r.keys, r.producers)
	}
	return benchLatency(ctx, stdout, sqlEmitTx(drv.DB(), client), relay, bs.nc, bs.prefix, r.rate, r.duration, r.keys, r.producers)
}

// mysqlBench is a benchDB on MySQL.
func mysqlBench(drv *ferrymysql.Driver) *benchDB[*sql.Tx] {
	db := drv.DB()
	const upsertTail = ` ON DUPLICATE KEY UPDATE orders = orders + 1, last_seq = VALUES(last_seq)`
	upsert := func(table string) string {
		return "INSERT INTO " + table + " (customer, orders, last_seq) VALUES (?, 1, ?)" + upsertTail
	}
	return &benchDB[*sql.Tx]{
		drv:    drv,
		server: "mariadbd",
		create: func(ctx context.Context, name string) (string, error) {
			t := "`" + name + "`"
			_, err := db.ExecContext(ctx, "CREATE TABLE "+t+" (customer VARCHAR(255) PRIMARY KEY, orders BIGINT NOT NULL, last_seq BIGINT NOT NULL) ENGINE=InnoDB")
			return t, err
		},
		upsert: func(ctx context.Context, tx *sql.Tx, table, key string, seq int64) error {
			_, err := tx.ExecContext(ctx, upsert(table), key, seq)
			return err
		},
		upsertMany: func(ctx context.Context, tx *sql.Tx, table string, keys []string, seqs []int64) error {
			var q strings.Builder
			q.WriteString("INSERT INTO " + table + " (customer, orders, last_seq) VALUES ")
			args := make([]any, 0, 2*len(keys))
			for i := range keys {
				if i > 0 {
					q.WriteByte(',')
				}
				q.WriteString("(?, 1, ?)")
				args = append(args, keys[i], seqs[i])
			}
			_, err := tx.ExecContext(ctx, q.String()+upsertTail, args...)
			return err
		},
		alone: func(ctx context.Context, table, key string, seq int64) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, upsert(table), key, seq); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		},
		total: func(ctx context.Context, table string) (n int64, err error) {
			err = db.QueryRowContext(ctx, "SELECT COALESCE(SUM(orders), 0) FROM "+table).Scan(&n)
			return n, err
		},
	}
}
