package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// The steps of runDaemon: its logger, its database, its relays and its
// console.

// logger is the daemon's JSON logger at --log-level.
func (dc *daemonConfig) logger(stderr io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(dc.logLevel)); err != nil {
		return nil, usagef("--log-level / FERRY_LOG_LEVEL %q: use debug, info, warn or error", dc.logLevel)
	}
	return slog.New(tracedLogs(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))), nil
}

// sayDefaults logs the embedded defaults the daemon falls back on, if any:
// other is set when --sink-url names a broker other than NATS.
func (dc *daemonConfig) sayDefaults(log *slog.Logger, other bool) {
	var defaults []string
	if dc.embedded && dc.db.url == "" {
		defaults = append(defaults, "SQLite "+dc.db.embeddedDB())
	}
	if dc.embedded && dc.natsURL == "" && !other {
		defaults = append(defaults, "NATS JetStream in "+filepath.Join(dc.db.dataDir, "nats"))
	}
	if len(defaults) > 0 {
		log.Info("ferry: no database or broker configured: using the embedded defaults (set --database-url and --nats-url, or a config file, for your own)",
			"embedded", defaults, "data_dir", dc.db.dataDir)
	}
}

// openStore opens the database, migrates it when asked (always for the
// embedded default) and checks that a stream history that can age out
// (MongoDB's oplog) covers the retention plus an outage.
func (dc *daemonConfig) openStore(ctx context.Context, log *slog.Logger) (*backend, error) {
	dc.db.log = log // the backend's own lines (a MariaDB feed's recovery) join the relay's
	b, err := dc.db.open(ctx, dc.embedded)
	if err != nil {
		return nil, err
	}
	if dc.migrate || (dc.embedded && dc.db.url == "") {
		if err := migrateUp(ctx, b.store, log); err != nil {
			b.close()
			return nil, err
		}
	}
	if rc, ok := b.store.(interface {
		CheckRetention(context.Context, time.Duration) (string, error)
	}); ok && dc.retention > 0 {
		if warning, err := rc.CheckRetention(ctx, dc.retention); err != nil {
			log.Warn("ferry: could not compare the outbox retention with the oplog window", "err", err)
		} else if warning != "" {
			log.Warn("ferry: " + warning)
		}
	}
	return b, nil
}

// daemonRelays are the relays a daemon runs, the partitions they read and
// the balancer that shares them (ferry run; nil for ferry relay).
type daemonRelays struct {
	relays     []*ferry.Relay
	partitions []int
	bal        *ferry.Balancer
}

// newRelays builds one relay per partition the daemon runs, each with its
// own sink when the destination's connections are fenced.
func (dc *daemonConfig) newRelays(ctx context.Context, b *backend, dest *openedSink, reg *prometheus.Registry, log *slog.Logger) (*daemonRelays, error) {
	policy := ferry.Hold
	if dc.deadPolicy == "continue" {
		policy = ferry.Continue
	}
	n, err := partitionCount(ctx, b, dc.db.partitions)
	if err != nil {
		return nil, err
	}
	d := &daemonRelays{partitions: []int{dc.partition}}
	if dc.allPartitions {
		// ferry run shares the partitions with the other processes
		// running relays for the feed; ferry relay --partition runs one.
		d.partitions = d.partitions[:0]
		for p := range n {
			d.partitions = append(d.partitions, p)
		}
		d.bal, err = ferry.NewBalancer(b.store, &ferry.BalancerConfig{Feed: dc.feed, Partitions: len(d.partitions), HolderID: dc.holder, LeaseTTL: dc.leaseTTL, Logger: log})
		if err != nil {
			return nil, err
		}
	}
	for i, p := range d.partitions {
		sink := dest.sink
		if i > 0 && dest.another != nil {
			if sink, err = dest.another(ctx); err != nil {
				return nil, err
			}
		}
		relay, err := ferry.NewRelay(b.store, sink, &ferry.RelayConfig{
			Feed: dc.feed, Partition: p, HolderID: dc.holder, BatchSize: dc.batch, PollInterval: dc.poll,
			LeaseTTL: dc.leaseTTL, Retention: dc.retention, ShutdownTimeout: dc.shutdown, Logger: log,
			StallTimeout: dc.stall, MaxAttempts: dc.maxAttempts, MaxAge: dc.maxAge, DeadPolicy: policy,
			DeadLetterRetention: dc.deadLetterRetention, KeyRetention: dc.keyRetention, Balancer: d.bal,
			Hooks: append([]ferryhook.Hook{ferryprom.New(wrapPartition(reg, p, len(d.partitions)))}, hooks...),
		})
		if err != nil {
			return nil, usagef("%v", err)
		}
		d.relays = append(d.relays, relay)
	}
	return d, nil
}

// serveUI serves the admin API and console in g until gctx ends; stop
// closes its server.
func (dc *daemonConfig) serveUI(gctx context.Context, g *errgroup.Group, b *backend, stderr io.Writer, log *slog.Logger) (stop func(), err error) {
	dc.ui.feed = dc.feed
	ui, err := startUI(b, dc.ui, stderr)
	if err != nil {
		return nil, fmt.Errorf("serve the admin API on --ui-addr / FERRY_UI_ADDR %s: %w (\"off\" disables it)", dc.ui.addr, err)
	}
	srv := ui.srv
	log.Info("ferry: admin API and console", "url", ui.url, "console", ui.console, "says", strings.Join(ui.says(dc.ui), "; "))
	g.Go(func() error {
		if err := srv.Serve(ui.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("admin API: %w", err)
		}
		return nil
	})
	g.Go(func() error { <-gctx.Done(); return srv.Close() })
	return func() { _ = srv.Close() }, nil
}
