package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// cmdRelay runs one relay for one partition against the database and
// NATS server it is given; `ferry run` is the daemon form with the
// embedded defaults and a config file.
func cmdRelay(ctx context.Context, args []string, _, stderr io.Writer) error {
	f := newFlags("relay", stderr)
	fc := &runConfig{}
	noMigrate := false
	fc.Database.Migrate = &noMigrate
	var dc daemonConfig
	dc.register(f, fc)
	f.Int(&dc.partition, "partition", "FERRY_PARTITION", 0, "outbox partition this relay reads")
	if err := f.Parse(args); err != nil {
		return err
	}
	dc.allPartitions = false
	return runDaemon(ctx, &dc, stderr)
}

// serveMetrics serves /metrics, /livez and /healthz (the process is not
// wedged) and /readyz (the database and the broker answer and, with pipe,
// the relays' partitions move): see health.go.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready func(context.Context) error, pipe *pipelineProbe) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	live, readyz := probeHandlers(ready, pipe)
	mux.HandleFunc("/livez", live)
	mux.HandleFunc("/healthz", live)
	mux.HandleFunc("/readyz", readyz)
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return srv, nil
}
