package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func cmdRelay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("relay", stderr)
	var db dbFlags
	db.register(f)
	var (
		natsURL, prefix, stream, feed, holder, metricsAddr, logLevel string
		createStream, migrate                                        bool
		batch, partition                                             int
		poll, leaseTTL, retention                                    time.Duration
	)
	f.String(&natsURL, "nats-url", "FERRY_NATS_URL", nats.DefaultURL, "NATS server URL")
	f.String(&prefix, "subject-prefix", "FERRY_SUBJECT_PREFIX", ferrynats.DefaultSubjectPrefix, "events go to subject <prefix>.<topic>")
	f.String(&stream, "stream", "FERRY_STREAM", ferrynats.DefaultStream, "JetStream stream that captures <prefix>.>")
	f.Bool(&createStream, "create-stream", "FERRY_CREATE_STREAM", true, "create the stream if it does not exist")
	f.Int(&batch, "batch", "FERRY_BATCH_SIZE", 500, "events read and published at once")
	f.Duration(&poll, "poll-interval", "FERRY_POLL_INTERVAL", 500*time.Millisecond, "longest wait for new events without a wake-up")
	f.Duration(&leaseTTL, "lease-ttl", "FERRY_LEASE_TTL", 15*time.Second, "leader lease; a standby takes over within about this long")
	f.Duration(&retention, "retention", "FERRY_RETENTION", 24*time.Hour, "keep published events this long (negative: forever)")
	f.String(&feed, "feed", "FERRY_FEED", "default", "feed name (checkpoint and lease)")
	f.Int(&partition, "partition", "FERRY_PARTITION", 0, "outbox partition this relay reads")
	f.String(&holder, "holder", "FERRY_HOLDER", "", "this relay's name in the lease (default host-pid-random)")
	f.String(&metricsAddr, "metrics-addr", "FERRY_METRICS_ADDR", "127.0.0.1:9464", "serve /metrics, /healthz, /readyz here (empty: off)")
	f.String(&logLevel, "log-level", "FERRY_LOG_LEVEL", "info", "debug, info, warn or error")
	f.Bool(&migrate, "migrate", "FERRY_MIGRATE", false, "apply pending schema migrations before starting")
	if err := f.Parse(args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return usagef("--log-level / FERRY_LOG_LEVEL %q: use debug, info, warn or error", logLevel)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	pool, drv, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if migrate {
		if err := migrateUp(ctx, drv, log); err != nil {
			return err
		}
	}
	nc, err := nats.Connect(natsURL, nats.Name("ferry-relay"), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(false))
	if err != nil {
		return fmt.Errorf("cannot reach NATS at --nats-url / FERRY_NATS_URL (%s): %w", natsURL, err)
	}
	defer nc.Close()
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{SubjectPrefix: prefix, Stream: stream, CreateStream: createStream})
	if err != nil {
		return fmt.Errorf("%w (see --stream / FERRY_STREAM, --subject-prefix / FERRY_SUBJECT_PREFIX, --create-stream)", err)
	}
	defer sink.Close(context.WithoutCancel(ctx))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{
		Feed: feed, Partition: partition, HolderID: holder, BatchSize: batch, PollInterval: poll,
		LeaseTTL: leaseTTL, Retention: retention, Logger: log, Registerer: reg,
	})
	if err != nil {
		return usagef("%v", err)
	}
	if metricsAddr != "" {
		srv, err := serveMetrics(ctx, metricsAddr, reg, func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return fmt.Errorf("database: %w", err)
			}
			if !nc.IsConnected() {
				return errors.New("nats: not connected")
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("serve metrics on --metrics-addr / FERRY_METRICS_ADDR %s: %w", metricsAddr, err)
		}
		defer srv.Close()
		log.Info("ferry: metrics and health endpoints", "addr", srv.Addr)
	}
	log.Info("ferry: relay starting", "feed", relay.FeedName(), "schema", db.schema, "nats", natsURL, "stream", stream, "subject_prefix", prefix)
	if err := relay.Run(ctx); err != nil {
		return err
	}
	log.Info("ferry: relay stopped")
	return nil
}

// serveMetrics serves /metrics, /healthz (the process is up) and /readyz
// (the database and the broker answer).
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready func(context.Context) error) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	var lastErr atomic.Value
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		rctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ready(rctx); err != nil {
			lastErr.Store(err.Error())
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return srv, nil
}
