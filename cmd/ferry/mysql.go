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
	drv, err := ferrymysql.Open(dsn, &ferrymysql.Config{Partitions: d.partitions, Logger: slog.Default()})
	if err != nil {
		return nil, fmt.Errorf("cannot reach MySQL at --database-url / FERRY_DATABASE_URL (%s): %w", redactMySQL(dsn), err)
	}
	emit, err := emitter(drv)
	if err != nil {
		_ = drv.Close()
		return nil, err
	}
	return &backend{
		name: "mysql", label: "database " + drv.Schema(), store: drv, emit: emit,
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
	duration, poll                       time.Duration
	keep                                 bool
}

// benchMySQL runs drain and latency on MySQL: in a fresh database of the
// server the URL names, removed after the run unless kept.
func benchMySQL(ctx context.Context, stdout, stderr io.Writer, mode string, db *dbFlags, natsURL string, r benchRun) error {
	if mode != "drain" && mode != "latency" {
		return usagef("ferry bench %s does not run on MySQL yet: drain and latency do", mode)
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
	var version string
	_ = drv.DB().QueryRowContext(ctx, "SELECT VERSION()").Scan(&version)
	fmt.Fprintf(stdout, "ferry bench %s: MySQL %s, NATS %s, GOMAXPROCS %d, batch %d, keys %d\n", mode, version, bs.nc.ConnectedServerVersion(),
		runtime.GOMAXPROCS(0), r.batch, r.keys)
	if mode == "drain" {
		return benchDrain(ctx, stdout, client, relay, bs.js, bs.stream, r.events, r.keys, r.producers)
	}
	return benchLatency(ctx, stdout, sqlEmitTx(drv.DB(), client), relay, bs.nc, bs.prefix, r.rate, r.duration, r.keys, r.producers)
}
