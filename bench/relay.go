package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
)

// RelayEnv is set (to "1") in the environment of the relay child, so that
// a test binary re-executed as the child runs RelayMain instead of tests.
const RelayEnv = "FERRY_BENCH_RELAY"

// runFunc runs a relay until ctx is done.
type runFunc func(ctx context.Context) error

// childConfig is the relay child's configuration, from its flags.
type childConfig struct {
	impl    string
	dbURL   string
	natsURL string
	schema  string
	sqlite  string
	stream  string
	prefix  string
	count   int
	keys    int
	nonce   uint64
	cpuProf string
	stats   string // consumers: where to write what was applied
	stderr  io.Writer
}

func (c *childConfig) openPool(ctx context.Context, maxConns int) (*pgxpool.Pool, error) {
	return c.openTracedPool(ctx, maxConns, nil)
}

// openTracedPool is openPool with a pgx tracer on its connections (none
// when tracer is nil).
func (c *childConfig) openTracedPool(ctx context.Context, maxConns int, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(c.dbURL)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "ferrybench-relay-" + c.impl
	pc.ConnConfig.Tracer = tracer
	pc.MaxConns = int32(maxConns)
	return pgxpool.NewWithConfig(ctx, pc)
}

func (c *childConfig) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// RelayMain is the hidden `relay` subcommand: the relay (or, for the
// consume scenario, the consumer) under test, in its own process so that
// its CPU time and peak RSS are its own. It sets the relay up, prints
// "ready", starts on a "go" line from stdin and stops (gracefully) when
// stdin closes.
func RelayMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &childConfig{stderr: stderr}
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.impl, "impl", "", "relay implementation")
	fs.StringVar(&c.dbURL, "database-url", "", "PostgreSQL URL")
	fs.StringVar(&c.natsURL, "nats-url", nats.DefaultURL, "NATS URL")
	fs.StringVar(&c.schema, "schema", "", "contender schema")
	fs.StringVar(&c.sqlite, "sqlite", "", "SQLite file (ferry-sqlite)")
	fs.StringVar(&c.stream, "stream", "", "JetStream stream")
	fs.StringVar(&c.prefix, "prefix", "", "subject prefix")
	fs.IntVar(&c.count, "count", 0, "publish-only: events to publish")
	fs.IntVar(&c.keys, "keys", 1000, "publish-only: keys")
	fs.Uint64Var(&c.nonce, "nonce", 0, "publish-only: event ID nonce")
	fs.StringVar(&c.cpuProf, "cpuprofile", "", "write a CPU profile of the run (from \"go\" to the stop) to this file")
	fs.StringVar(&c.stats, "stats", "", "consumers: write what was applied to this file when stopped")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := runChild(c, stdin, stdout); err != nil {
		fmt.Fprintln(stderr, "relay:", err)
		return 1
	}
	return 0
}

func runChild(c *childConfig, stdin io.Reader, stdout io.Writer) error {
	ctx := context.Background()
	build := buildRelayChild
	if isConsumer(c.impl) {
		build = buildConsumer
	}
	run, cleanup, err := build(ctx, c)
	if err != nil {
		return err
	}
	if cleanup != nil {
		defer cleanup()
	}
	fmt.Fprintln(stdout, "ready")

	lines := bufio.NewScanner(stdin)
	if !lines.Scan() || strings.TrimSpace(lines.Text()) != "go" {
		return nil // the driver gave up before starting
	}
	if c.cpuProf != "" {
		f, err := os.Create(c.cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(rctx) }()
	go func() {
		for lines.Scan() {
		}
		cancel() // stdin closed: stop
	}()
	err = <-done
	cancel()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// buildRelayChild connects to NATS, opens the shared sink on the phase's
// stream and builds the relay; its cleanup closes the three in turn.
func buildRelayChild(ctx context.Context, c *childConfig) (runFunc, func(), error) {
	nc, err := nats.Connect(c.natsURL, nats.Name("ferrybench-relay-"+c.impl))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS: %w", err)
	}
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: c.stream, SubjectPrefix: c.prefix, CreateStream: true})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	run, cleanup, err := buildRelay(ctx, c, sink)
	closeAll := func() {
		if cleanup != nil {
			cleanup()
		}
		_ = sink.Close(context.Background())
		nc.Close()
	}
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return run, closeAll, nil
}

func buildRelay(ctx context.Context, c *childConfig, sink *ferrynats.Sink) (runFunc, func(), error) {
	switch c.impl {
	case "ferry":
		return ferryPGRelay(ctx, c, sink)
	case "ferry-sqlite":
		return ferrySQLiteRelay(ctx, c, sink)
	case "watermill":
		return watermillRelay(ctx, c, watermillStock, sink)
	case "watermill-tuned":
		return watermillRelay(ctx, c, watermillTuned, sink)
	case "river":
		return riverRelay(ctx, c, riverDefault, sink)
	case "river-tuned":
		return riverRelay(ctx, c, riverTuned, sink)
	case "naive-cursor":
		return naiveRelay(ctx, c, "cursor", sink)
	case "naive-claim":
		return naiveRelay(ctx, c, "claim", sink)
	case "publish-async", "publish-sync":
		return publishOnly(c, sink), nil, nil
	}
	return nil, nil, fmt.Errorf("unknown --impl %q", c.impl)
}

// publishOnly is the sink ceiling: pre-built events straight into the
// shared sink, 1,000 per Publish call (asynchronous, the sink's window of
// 256 in flight) or one per call (synchronous, one in flight). The process
// then idles until told to stop.
func publishOnly(c *childConfig, sink *ferrynats.Sink) runFunc {
	evs := make([]*ferryevent.Event, c.count)
	for g := range evs {
		m := Meta{G: int64(g), Key: g%c.keys + 1, Seq: int64(g/c.keys + 1)}
		evs[g] = ferryEvent(EventID(c.nonce, m.G), m.Key, EncodePayload(m))
	}
	return func(ctx context.Context) error {
		size := 1000
		if c.impl == "publish-sync" {
			size = 1
		}
		for _, b := range chunks(evs, size) {
			if err := publishAll(ctx, sink, b); err != nil {
				return err
			}
		}
		<-ctx.Done()
		return nil
	}
}

// waitReady is used by the driver: it reads the child's stdout until
// "ready" or the timeout.
func waitReady(r *bufio.Reader, timeout time.Duration) error {
	type res struct {
		line string
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil || strings.TrimSpace(line) == "ready" {
				ch <- res{line, err}
				return
			}
		}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("relay child exited before it was ready: %w", r.err)
		}
		return nil
	case <-time.After(timeout):
		return errors.New("relay child not ready in time")
	}
}
