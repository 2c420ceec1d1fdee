package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.yaml.in/yaml/v3"
	"golang.org/x/sync/errgroup"
)

// exampleConfig is the documented example of ferry.yaml; `ferry run
// --print-config` prints it and a test checks that it loads.
//
//go:embed ferry.example.yaml
var exampleConfig []byte

// duration is a time.Duration written as "500ms" or "15s" in YAML.
type duration time.Duration

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration such as 500ms, 15s or 24h", n.Line, n.Value)
	}
	*d = duration(v)
	return nil
}

// runConfig is the daemon's configuration: ferry.yaml, then FERRY_*
// variables and flags over it.
type runConfig struct {
	DataDir  string `yaml:"data_dir"`
	Database struct {
		URL        string `yaml:"url"`
		Schema     string `yaml:"schema"`
		Partitions int    `yaml:"partitions"`
		NoNotify   bool   `yaml:"no_notify"`
		Migrate    *bool  `yaml:"migrate"`
	} `yaml:"database"`
	NATS struct {
		URL           string `yaml:"url"`
		EmbeddedPort  int    `yaml:"embedded_port"`
		Stream        string `yaml:"stream"`
		SubjectPrefix string `yaml:"subject_prefix"`
		Shares        int    `yaml:"shares"`
		CreateStream  *bool  `yaml:"create_stream"`
	} `yaml:"nats"`
	Sink struct {
		URL string `yaml:"url"`
	} `yaml:"sink"`
	Relay struct {
		Feed                string   `yaml:"feed"`
		Holder              string   `yaml:"holder"`
		BatchSize           int      `yaml:"batch_size"`
		PollInterval        duration `yaml:"poll_interval"`
		LeaseTTL            duration `yaml:"lease_ttl"`
		Retention           duration `yaml:"retention"`
		Shutdown            duration `yaml:"shutdown_timeout"`
		StallTimeout        duration `yaml:"stall_timeout"`
		MaxAttempts         int      `yaml:"max_attempts"`
		MaxAge              duration `yaml:"max_age"`
		DeadPolicy          string   `yaml:"dead_policy"`
		DeadLetterRetention duration `yaml:"dead_letter_retention"`
		KeyRetention        duration `yaml:"key_retention"`
	} `yaml:"relay"`
	Metrics struct {
		Addr              string   `yaml:"addr"`
		HealthStallAfter  duration `yaml:"health_stall_after"`
		HealthStuckKeyAge duration `yaml:"health_stuck_key_age"`
	} `yaml:"metrics"`
	UI struct {
		Addr      string `yaml:"addr"`
		ReadOnly  bool   `yaml:"read_only"`
		Hosts     string `yaml:"hosts"`
		OpenReads bool   `yaml:"open_reads"`
	} `yaml:"ui"`
	Log struct {
		Level string `yaml:"level"`
	} `yaml:"log"`
}

// loadRunConfig reads a ferry.yaml; unknown keys are errors.
func loadRunConfig(path string) (*runConfig, error) {
	cfg := &runConfig{}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--config %s: %v", path, err)
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(raw)).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, usagef("--config %s: %v (see `ferry run --print-config` for every key)", path, err)
	}
	if len(doc.Content) == 0 {
		return cfg, nil
	}
	if err := checkKeys(doc.Content[0], reflect.TypeFor[runConfig](), ""); err != nil {
		return nil, usagef("--config %s: %v (see `ferry run --print-config` for every key)", path, err)
	}
	if err := doc.Decode(cfg); err != nil {
		return nil, usagef("--config %s: %v (see `ferry run --print-config` for every key)", path, err)
	}
	return cfg, nil
}

// checkKeys reports the first key of the YAML mapping n that the struct t
// has no field for, named by its whole path ("relay.batchsize") with the
// keys that section does have, instead of the Go type yaml.v3 names.
func checkKeys(n *yaml.Node, t reflect.Type, prefix string) error {
	if n.Kind != yaml.MappingNode || t.Kind() != reflect.Struct {
		return nil
	}
	fields := map[string]reflect.Type{}
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			fields[name] = t.Field(i).Type
			names = append(names, name)
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key := n.Content[i].Value
		ft, ok := fields[key]
		if !ok {
			where := "at the top level"
			if prefix != "" {
				where = "under " + strings.TrimSuffix(prefix, ".")
			}
			return fmt.Errorf("line %d: unknown key %q: the keys %s are %s", n.Content[i].Line, prefix+key, where, strings.Join(names, ", "))
		}
		if err := checkKeys(n.Content[i+1], ft, prefix+key+"."); err != nil {
			return err
		}
	}
	return nil
}

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// The config file is read first: it sets the defaults the flags show.
	cfgPath := os.Getenv("FERRY_CONFIG")
	for i, a := range args {
		if a == "--config" || a == "-config" {
			if i+1 < len(args) {
				cfgPath = args[i+1]
			}
		} else if v, ok := strings.CutPrefix(strings.TrimPrefix(a, "-"), "-config="); ok {
			cfgPath = v
		} else if v, ok := strings.CutPrefix(a, "-config="); ok {
			cfgPath = v
		}
	}
	fc := &runConfig{}
	if cfgPath != "" {
		var err error
		if fc, err = loadRunConfig(cfgPath); err != nil {
			return err
		}
	}
	f := newFlags("run", stderr)
	var (
		dc          daemonConfig
		printConfig bool
		ignored     string
	)
	f.String(&ignored, "config", "FERRY_CONFIG", cfgPath, "YAML configuration file (see --print-config); flags and FERRY_* variables override it")
	f.Bool(&printConfig, "print-config", "FERRY_PRINT_CONFIG", false, "print a commented example configuration and exit")
	dc.register(f, fc)
	f.Int(&dc.embeddedPort, "nats-port", "FERRY_NATS_PORT", or(fc.NATS.EmbeddedPort, defaultEmbeddedPort), "port of the embedded NATS server on 127.0.0.1, used when no --nats-url is set (0: any free port)")
	if err := f.Parse(args); err != nil {
		return err
	}
	_, envSet := os.LookupEnv("FERRY_NATS_PORT")
	dc.embeddedPortSet = envSet || fc.NATS.EmbeddedPort != 0 || f.isSet("nats-port")
	if printConfig {
		_, err := stdout.Write(exampleConfig)
		return err
	}
	dc.embedded = true
	return runDaemon(ctx, &dc, stderr)
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func orBool(v *bool, def bool) bool {
	if v == nil {
		return def
	}
	return *v
}

// daemonConfig is what runDaemon runs: `ferry run` and `ferry relay` fill it.
type daemonConfig struct {
	db                                                 dbFlags
	natsURL, prefix, stream, feed, holder, metricsAddr string
	sinkURL                                            string
	ui                                                 uiSettings
	logLevel                                           string
	createStream, migrate                              bool
	batch, partition, shares                           int
	poll, leaseTTL, retention, shutdown, stall, maxAge time.Duration
	deadLetterRetention, keyRetention                  time.Duration
	healthStallAfter, healthStuckKeyAge                time.Duration // /readyz's rules (health.go)
	maxAttempts                                        int
	deadPolicy                                         string
	allPartitions                                      bool // one relay per partition (ferry run)
	embedded                                           bool // no database or NATS URL: start the embedded ones
	embeddedPort                                       int
	embeddedPortSet                                    bool // chosen, not defaulted
}

// defaultEmbeddedPort is NATS's own default port, so that `ferry tail` and
// the NATS tools find the embedded server without flags.
const defaultEmbeddedPort = 4222

func (dc *daemonConfig) register(f *envFlags, fc *runConfig) {
	d := &dc.db
	f.String(&d.url, "database-url", "FERRY_DATABASE_URL", fc.Database.URL,
		"postgres://user@host:5432/app, mongodb://host/app?replicaSet=rs0, or sqlite:path/to/file.db (default: the embedded SQLite database <data-dir>/ferry.db)")
	f.String(&d.schema, "schema", "FERRY_SCHEMA", or(fc.Database.Schema, "ferry"), "PostgreSQL schema holding Ferry's tables")
	f.Int(&d.partitions, "partitions", "FERRY_PARTITIONS", fc.Database.Partitions, "number of outbox partitions, one relay each; 0: the count stored with the schema (ferry partitions show says it), another value must match it")
	f.Bool(&d.noNotify, "no-notify", "FERRY_NO_NOTIFY", fc.Database.NoNotify, "PostgreSQL: do not use LISTEN/NOTIFY; relays only poll")
	f.String(&d.dataDir, "data-dir", "FERRY_DATA_DIR", or(fc.DataDir, "ferry-data"), "directory of the embedded defaults: SQLite database ferry.db and the NATS store")
	f.Bool(&dc.migrate, "migrate", "FERRY_MIGRATE", orBool(fc.Database.Migrate, true), "apply pending schema migrations before starting")
	f.String(&dc.natsURL, "nats-url", "FERRY_NATS_URL", fc.NATS.URL, "NATS server URL (default: an embedded NATS server with JetStream, its store in <data-dir>/nats)")
	f.String(&dc.sinkURL, "sink-url", "FERRY_SINK_URL", fc.Sink.URL, "where events go, when not NATS: "+sinkURLHelp)
	f.String(&dc.prefix, "subject-prefix", "FERRY_SUBJECT_PREFIX", or(fc.NATS.SubjectPrefix, ferrynats.DefaultSubjectPrefix), "events go to subject <prefix>.<topic>")
	f.Int(&dc.shares, "shares", "FERRY_SHARES", fc.NATS.Shares, "divide the subjects into this many shares, <prefix>.<share>.<topic>, for consumers spread over replicas (ferrynats.SourceConfig.Shares, the same number); 0: none")
	f.String(&dc.stream, "stream", "FERRY_STREAM", or(fc.NATS.Stream, ferrynats.DefaultStream), "JetStream stream that captures <prefix>.>")
	f.Bool(&dc.createStream, "create-stream", "FERRY_CREATE_STREAM", orBool(fc.NATS.CreateStream, true), "create the stream if it does not exist")
	f.String(&dc.feed, "feed", "FERRY_FEED", or(fc.Relay.Feed, "default"), "feed name (checkpoints and leases are <feed>/<partition>)")
	f.String(&dc.holder, "holder", "FERRY_HOLDER", fc.Relay.Holder, "this relay's name in the lease (default host-pid-random)")
	f.Int(&dc.batch, "batch", "FERRY_BATCH_SIZE", or(fc.Relay.BatchSize, 500), "events read and published at once")
	f.Duration(&dc.poll, "poll-interval", "FERRY_POLL_INTERVAL", or(time.Duration(fc.Relay.PollInterval), 500*time.Millisecond), "longest wait for new events without a wake-up")
	f.Duration(&dc.leaseTTL, "lease-ttl", "FERRY_LEASE_TTL", or(time.Duration(fc.Relay.LeaseTTL), 15*time.Second), "leader lease; a standby takes over within about this long")
	f.Duration(&dc.retention, "retention", "FERRY_RETENTION", or(time.Duration(fc.Relay.Retention), 24*time.Hour), "keep published events this long (negative: forever)")
	f.Duration(&dc.shutdown, "shutdown-timeout", "FERRY_SHUTDOWN_TIMEOUT", or(time.Duration(fc.Relay.Shutdown), 10*time.Second),
		"after SIGTERM, exit within this long (plus about a second to close connections), whatever the destination does; keep it below Kubernetes' terminationGracePeriodSeconds")
	f.Duration(&dc.stall, "stall-timeout", "FERRY_STALL_TIMEOUT", or(time.Duration(fc.Relay.StallTimeout), 2*time.Second),
		"a key whose event goes unacknowledged this long while others flow is parked: set aside in the database and published from there once its destination answers")
	f.Int(&dc.maxAttempts, "max-attempts", "FERRY_MAX_ATTEMPTS", fc.Relay.MaxAttempts, "give up on an event after this many failed attempts (0: never)")
	f.Duration(&dc.maxAge, "max-age", "FERRY_MAX_AGE", time.Duration(fc.Relay.MaxAge), "give up on an event this long after its first failed attempt (0: never)")
	f.String(&dc.deadPolicy, "dead-policy", "FERRY_DEAD_POLICY", or(fc.Relay.DeadPolicy, "hold"),
		"on giving up: hold (the key waits until ferry parked release or skip lets it go) or continue (dead-letter the event, go on with the key)")
	f.Duration(&dc.deadLetterRetention, "dead-letter-retention", "FERRY_DEAD_LETTER_RETENTION", or(time.Duration(fc.Relay.DeadLetterRetention), 14*24*time.Hour), "keep the relay's dead letters this long (negative: forever)")
	f.Duration(&dc.keyRetention, "key-retention", "FERRY_KEY_RETENTION", time.Duration(fc.Relay.KeyRetention), "forget a key's sequence once it is idle this long with every event delivered; its next Seq is 1 (0: as --retention; negative: never)")
	f.String(&dc.metricsAddr, "metrics-addr", "FERRY_METRICS_ADDR", or(fc.Metrics.Addr, "127.0.0.1:9464"), "serve /metrics, /livez (/healthz), /readyz here (\"off\": no server)")
	f.Duration(&dc.healthStallAfter, "health-stall-after", "FERRY_HEALTH_STALL_AFTER", or(time.Duration(fc.Metrics.HealthStallAfter), time.Minute),
		"/readyz fails when a partition this process leads has events waiting and its checkpoint has not moved for this long (0: never)")
	f.Duration(&dc.healthStuckKeyAge, "health-stuck-key-age", "FERRY_HEALTH_STUCK_KEY_AGE", or(time.Duration(fc.Metrics.HealthStuckKeyAge), 10*time.Minute),
		"/readyz fails when a key has waited this long for its destination's acknowledgement (parked, held or retried; 0: never)")
	f.String(&dc.logLevel, "log-level", "FERRY_LOG_LEVEL", or(fc.Log.Level, "info"), "debug, info, warn or error")
	dc.ui.hosts, dc.ui.openReads = fc.UI.Hosts, fc.UI.OpenReads
	dc.ui.register(f)
	f.String(&dc.ui.addr, "ui-addr", "FERRY_UI_ADDR", or(fc.UI.Addr, "off"), "serve the web console and its admin API (as ferry ui does) here, e.g. "+defaultUIAddr+" (\"off\": no console)")
	f.Bool(&dc.ui.readOnly, "ui-read-only", "FERRY_UI_READ_ONLY", fc.UI.ReadOnly, "the console and its API refuse every action")
	dc.allPartitions = true
}

// validate checks the relay settings as the user gave them, naming the
// flag, its variable and the configuration file's key, before the daemon
// opens anything: the library's errors name Go fields, and take a zero as
// "the default".
func (dc *daemonConfig) validate() error {
	name := func(flag, env, key string) string { return "--" + flag + " / " + env + " / relay." + key }
	switch {
	case dc.batch < 1:
		return usagef("%s is %d: use 1 or more (default 500)", name("batch", "FERRY_BATCH_SIZE", "batch_size"), dc.batch)
	case dc.poll < time.Millisecond:
		return usagef("%s is %v: use 1ms or more (default 500ms)", name("poll-interval", "FERRY_POLL_INTERVAL", "poll_interval"), dc.poll)
	case dc.leaseTTL < time.Second:
		return usagef("%s is %v: use 1s or more (default 15s)", name("lease-ttl", "FERRY_LEASE_TTL", "lease_ttl"), dc.leaseTTL)
	case dc.shutdown <= 0:
		return usagef("%s is %v: use a positive duration (default 10s)", name("shutdown-timeout", "FERRY_SHUTDOWN_TIMEOUT", "shutdown_timeout"), dc.shutdown)
	case dc.stall < 10*time.Millisecond:
		return usagef("%s is %v: use 10ms or more (default 2s)", name("stall-timeout", "FERRY_STALL_TIMEOUT", "stall_timeout"), dc.stall)
	case dc.maxAttempts < 0:
		return usagef("%s is %d: use 0 (never give up) or more", name("max-attempts", "FERRY_MAX_ATTEMPTS", "max_attempts"), dc.maxAttempts)
	case dc.maxAge < 0:
		return usagef("%s is %v: use 0 (never give up) or a positive duration", name("max-age", "FERRY_MAX_AGE", "max_age"), dc.maxAge)
	case !dc.allPartitions && dc.partition < 0:
		return usagef("--partition / FERRY_PARTITION is %d: use 0 or more (0 is the first partition; `ferry partitions show` lists them)", dc.partition)
	case dc.healthStallAfter < 0:
		return usagef("--health-stall-after / FERRY_HEALTH_STALL_AFTER / metrics.health_stall_after is %v: use 0 (never) or a positive duration (default 1m)", dc.healthStallAfter)
	case dc.healthStuckKeyAge < 0:
		return usagef("--health-stuck-key-age / FERRY_HEALTH_STUCK_KEY_AGE / metrics.health_stuck_key_age is %v: use 0 (never) or a positive duration (default 10m)", dc.healthStuckKeyAge)
	case dc.deadPolicy != "hold" && dc.deadPolicy != "continue":
		return usagef("%s is %q: use hold or continue", name("dead-policy", "FERRY_DEAD_POLICY", "dead_policy"), dc.deadPolicy)
	}
	return nil
}

// runDaemon runs relays (one per partition, or the one --partition names)
// until ctx ends.
func runDaemon(ctx context.Context, dc *daemonConfig, stderr io.Writer) error {
	if err := dc.validate(); err != nil {
		return err // before anything touches the database or the broker
	}
	log, err := dc.logger(stderr)
	if err != nil {
		return err
	}
	if strings.HasPrefix(dc.sinkURL, "nats://") && dc.natsURL == "" {
		dc.natsURL = dc.sinkURL
	}
	dest, other, err := openSinkURL(ctx, dc.sinkURL, log)
	if err != nil {
		return err
	}
	if other {
		defer dest.close()
	}
	dc.sayDefaults(log, other)
	b, err := dc.openStore(ctx, log)
	if err != nil {
		return err
	}
	defer b.close()
	if !other {
		if dest, err = openNATS(ctx, dc, log); err != nil {
			return err
		}
		defer dest.close()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d, err := dc.newRelays(ctx, b, dest, reg, log)
	if err != nil {
		return err
	}
	if dc.metricsAddr != "" && dc.metricsAddr != "off" {
		srv, err := serveMetrics(ctx, dc.metricsAddr, reg, func(ctx context.Context) error {
			if err := b.ping(ctx); err != nil {
				return fmt.Errorf("database: %w", err)
			}
			return dest.ready()
		}, newPipelineProbe(d.relays, d.partitions, b.store, dc))
		if err != nil {
			return fmt.Errorf("serve metrics on --metrics-addr / FERRY_METRICS_ADDR %s: %w (\"off\" disables it)", dc.metricsAddr, err)
		}
		defer srv.Close()
		log.Info("ferry: metrics and health endpoints", "addr", srv.Addr)
	}
	g, gctx := errgroup.WithContext(ctx)
	if dc.ui.addr != "" && dc.ui.addr != "off" {
		stop, err := dc.serveUI(gctx, g, b, stderr, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if d.bal != nil {
		g.Go(func() error { return d.bal.Run(gctx) })
	}
	for _, relay := range d.relays {
		log.Info("ferry: relay starting", append([]any{"feed", relay.FeedName(), "database", b.label}, dest.label...)...)
		g.Go(func() error { return relay.Run(gctx) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	log.Info("ferry: stopped")
	return nil
}

// openNATS connects to --nats-url, or starts the embedded server, and
// returns the JetStream sink.
func openNATS(ctx context.Context, dc *daemonConfig, log *slog.Logger) (*openedSink, error) {
	var stop []func()
	closeAll := func() {
		for i := len(stop) - 1; i >= 0; i-- {
			stop[i]()
		}
	}
	natsURL := dc.natsURL
	if natsURL == "" {
		if !dc.embedded {
			natsURL = nats.DefaultURL
		} else {
			store := filepath.Join(dc.db.dataDir, "nats")
			en, err := startEmbeddedNATS(store, dc.embeddedPort)
			if errors.Is(err, errPortTaken) && dc.embeddedPort == defaultEmbeddedPort && !dc.embeddedPortSet {
				log.Warn("ferry: port 4222 is taken (another NATS server?): the embedded one listens on a free port instead; set --nats-port to choose", "err", err)
				en, err = startEmbeddedNATS(store, 0)
			}
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("%w (choose another with --nats-port / FERRY_NATS_PORT, 0 for any free port, or use your own server with --nats-url)", err)
			}
			stop = append(stop, en.Close)
			natsURL = en.url
			log.Info("ferry: embedded NATS server listening", "url", natsURL)
		}
	}
	// Each sink has its own fenced connection (WriteFence): a refused
	// write closes the connection, and with it every message waiting on
	// it, so a connection serves one relay (openedSink.another).
	var mu sync.Mutex // guards conns and stop once the first sink is open
	var conns []*nats.Conn
	open := func(ctx context.Context) (*ferrynats.Sink, error) {
		nc, err := nats.Connect(natsURL, nats.Name("ferry-relay"), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(false), ferrynats.WriteFence())
		if err != nil {
			return nil, fmt.Errorf("cannot reach NATS at --nats-url / FERRY_NATS_URL (%s): %w", natsURL, err)
		}
		sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{SubjectPrefix: dc.prefix, Shares: dc.shares, Stream: dc.stream, CreateStream: dc.createStream})
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("%w (see --stream / FERRY_STREAM, --subject-prefix / FERRY_SUBJECT_PREFIX, --shares / FERRY_SHARES, --create-stream)", err)
		}
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, nc)
		stop = append(stop, nc.Close, func() { closeSink(sink) })
		return sink, nil
	}
	sink, err := open(ctx)
	if err != nil {
		closeAll()
		return nil, err
	}
	return &openedSink{
		sink:  sink,
		label: []any{"nats", natsURL, "stream", dc.stream, "subject_prefix", dc.prefix, "shares", dc.shares},
		ready: func() error {
			mu.Lock()
			defer mu.Unlock()
			for _, nc := range conns {
				if !nc.IsConnected() {
					return errors.New("nats: not connected")
				}
			}
			return nil
		},
		close: func() {
			mu.Lock()
			defer mu.Unlock()
			closeAll()
		},
		another: func(ctx context.Context) (ferrysink.Sink, error) { return open(ctx) },
	}, nil
}

// wrapPartition labels each relay's metrics with its partition when a
// process runs several (their metric names would collide otherwise).
func wrapPartition(reg prometheus.Registerer, p, n int) prometheus.Registerer {
	if n == 1 {
		return reg
	}
	return prometheus.WrapRegistererWith(prometheus.Labels{"partition": strconv.Itoa(p)}, reg)
}
