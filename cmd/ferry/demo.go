package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// `ferry demo`: an online shop in one process. Producers create orders and
// emit an OrderPlaced event in the same SQLite transaction; the relay
// publishes the outbox to an embedded NATS JetStream; a consumer group
// reads the stream into its inbox and keeps a per-customer projection,
// each event's effect in the same transaction as its inbox completion. At
// the end every claim is checked against the data itself.

const (
	demoStream = "FERRY_DEMO"
	demoPrefix = "demo"
	demoGroup  = "projection"
)

type demoConfig struct {
	dir       string // empty: a temporary directory, removed afterwards
	keep      bool
	events    int
	keys      int
	rate      int // events per second over all producers; 0: as fast as possible
	producers int
	crash     bool
	seed      uint64
	out       io.Writer
	tty       bool // redraw one progress line instead of printing lines
	interval  time.Duration
	ui        bool   // after the checks, serve the console on the demo's data until interrupted
	uiAddr    string // where
}

func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("demo", stderr)
	cfg := demoConfig{out: stdout}
	var seed int
	f.String(&cfg.dir, "dir", "FERRY_DEMO_DIR", "", "data directory (default: a temporary one, removed at the end)")
	f.Bool(&cfg.keep, "keep", "FERRY_DEMO_KEEP", false, "keep the temporary data directory to look at it afterwards")
	f.Int(&cfg.events, "events", "FERRY_DEMO_EVENTS", 20000, "orders to create, one event each")
	f.Int(&cfg.keys, "keys", "FERRY_DEMO_KEYS", 500, "customers; each customer's events must apply in order")
	f.Int(&cfg.rate, "rate", "FERRY_DEMO_RATE", 0, "orders per second over all producers (0: as fast as possible; 2000 with --crash)")
	f.Int(&cfg.producers, "producers", "FERRY_DEMO_PRODUCERS", 4, "concurrent producers")
	f.Bool(&cfg.crash, "crash", "FERRY_DEMO_CRASH", false, "crash the relay and the consumer at random moments while orders flow, and restart them")
	f.Int(&seed, "seed", "FERRY_DEMO_SEED", 0, "random seed (0: random)")
	f.Bool(&cfg.ui, "ui", "FERRY_DEMO_UI", false, "after the checks, keep the demo's data and serve the web console on it until Ctrl-C")
	f.String(&cfg.uiAddr, "ui-addr", "FERRY_UI_ADDR", defaultUIAddr, "with --ui, the console's address")
	if err := f.Parse(args); err != nil {
		return err
	}
	switch {
	case cfg.events < 1:
		return usagef("--events %d: use 1 or more", cfg.events)
	case cfg.keys < 1:
		return usagef("--keys %d: use 1 or more", cfg.keys)
	case cfg.producers < 1:
		return usagef("--producers %d: use 1 or more", cfg.producers)
	case cfg.rate < 0:
		return usagef("--rate %d: use 0 (as fast as possible) or more", cfg.rate)
	}
	if cfg.crash && cfg.rate == 0 {
		cfg.rate = 2000 // long enough for several crashes
	}
	cfg.seed = uint64(seed)
	if file, ok := stdout.(*os.File); ok {
		if st, err := file.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			cfg.tty = true
		}
	}
	rep, err := runDemo(ctx, cfg)
	if err != nil {
		return err
	}
	if !rep.ok() {
		return errors.New("verification failed: see the checks marked FAIL above")
	}
	return nil
}

type order struct {
	OrderID     int64  `json:"order_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

type demo struct {
	cfg     demoConfig
	log     *slog.Logger
	drv     *ferrysqlite.Driver
	client  *ferry.Client[*sql.Tx]
	natsURL string
	js      jetstream.JetStream

	produced       atomic.Int64
	dupInbox       atomic.Int64
	dupPublish     atomic.Uint64
	relayCrashes   atomic.Int64
	consumerCrashs atomic.Int64

	mu       sync.Mutex
	relay    *demoRelay
	consumer *demoConsumer
}

// demoReport is what the verification found, from the data.
type demoReport struct {
	Produced, InStream, Missing, StreamDuplicates  int64
	Applied, AppliedTwice, Violations, SeqMismatch int64
	Customers, ProjectionMismatch, Dead            int64
	DupPublish, DupInbox                           int64
	RelayCrashes, ConsumerCrashes                  int64
	Elapsed                                        time.Duration
	checks                                         []demoCheck
}

type demoCheck struct {
	name  string
	value string
	pass  bool
}

func (r *demoReport) ok() bool {
	for _, c := range r.checks {
		if !c.pass {
			return false
		}
	}
	return len(r.checks) > 0
}

func runDemo(ctx context.Context, cfg demoConfig) (*demoReport, error) {
	if cfg.interval == 0 {
		cfg.interval = 2 * time.Second
		if cfg.tty {
			cfg.interval = 200 * time.Millisecond
		}
	}
	if cfg.seed == 0 {
		cfg.seed = rand.Uint64()
	}
	dir := cfg.dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "ferry-demo-")
		if err != nil {
			return nil, err
		}
		dir = tmp
		if !cfg.keep {
			defer os.RemoveAll(tmp)
		}
	} else {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, usagef("--dir %s: %v (choose a directory you can write to, or leave --dir out for a temporary one)", dir, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "ferry.db")); err == nil {
			return nil, usagef("--dir %s already holds a demo (ferry.db): remove it, or choose another directory", dir)
		}
	}
	logFile, err := os.Create(filepath.Join(dir, "demo.log"))
	if err != nil {
		if cfg.dir != "" {
			return nil, usagef("--dir %s: %v (choose a directory you can write to, or leave --dir out for a temporary one)", dir, err)
		}
		return nil, err
	}
	defer logFile.Close()
	d := &demo{cfg: cfg, log: slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))}

	w := cfg.out
	create, mode := "create", "as fast as they can"
	if cfg.producers == 1 {
		create, mode = "creates", "as fast as it can"
	}
	if cfg.rate > 0 {
		mode = fmt.Sprintf("at %s orders/s", thousands(int64(cfg.rate)))
	}
	fmt.Fprintf(w, "Ferry demo: an order service in one process, on the embedded defaults (nothing to install).\n")
	fmt.Fprintf(w, "  data     %s (SQLite ferry.db, NATS store nats/, logs demo.log)\n", dir)
	fmt.Fprintf(w, "  produce  %s %s %s for %s, %s; each order's\n",
		plural(cfg.producers, "producer"), create, plural(cfg.events, "order"), plural(cfg.keys, "customer"), mode)
	fmt.Fprintf(w, "           OrderPlaced event is written to the outbox in the order's own transaction\n")
	fmt.Fprintf(w, "  relay    publishes the outbox, per customer in commit order, to JetStream stream %s\n", demoStream)
	fmt.Fprintf(w, "  consume  group %q reads the stream into its inbox and keeps per-customer totals,\n", demoGroup)
	fmt.Fprintf(w, "           each event's effect committed with its inbox row: applied exactly once, in order\n")
	if cfg.crash {
		fmt.Fprintf(w, "  crash    the relay and the consumer are killed at random moments (connections dropped,\n")
		fmt.Fprintf(w, "           work in flight abandoned, no clean shutdown) and started again\n")
	}
	fmt.Fprintln(w)

	en, err := startEmbeddedNATS(filepath.Join(dir, "nats"), 0)
	if err != nil {
		return nil, err
	}
	defer en.Close()
	d.natsURL = en.url
	nc, err := nats.Connect(en.url, nats.Name("ferry-demo"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if d.js, err = jetstream.New(nc); err != nil {
		return nil, err
	}
	// NORMAL: each commit survives a crash of the process (what --crash
	// shows), not of the machine; `ferry run` keeps FULL.
	if d.drv, err = ferrysqlite.Open(filepath.Join(dir, "ferry.db"), &ferrysqlite.Config{Synchronous: "NORMAL"}); err != nil {
		return nil, err
	}
	defer d.drv.Close()
	if _, err := d.drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		return nil, err
	}
	if err := d.createTables(ctx); err != nil {
		return nil, err
	}
	if d.client, err = ferry.NewClient(d.drv, nil); err != nil {
		return nil, err
	}

	start := time.Now()
	runCtx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	if err := d.startRelay(runCtx); err != nil {
		return nil, err
	}
	if err := d.startConsumer(runCtx); err != nil {
		return nil, err
	}
	produceErr := make(chan error, 1)
	go func() { produceErr <- d.produce(runCtx) }()
	crashDone := make(chan struct{})
	if cfg.crash {
		go func() { defer close(crashDone); d.crashLoop(runCtx) }()
	} else {
		close(crashDone)
	}
	waitErr := d.waitApplied(runCtx, produceErr)
	stopAll()
	<-crashDone
	d.stopAll()
	if waitErr != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		fmt.Fprintf(w, "\nthe demo did not finish: %v (logs: %s)\n", waitErr, filepath.Join(dir, "demo.log"))
	}
	rep, err := d.verify(ctx)
	if err != nil {
		return nil, err
	}
	rep.Elapsed = time.Since(start)
	if waitErr != nil {
		rep.checks = append(rep.checks, demoCheck{name: "finished in time", value: waitErr.Error(), pass: false})
	}
	d.printReport(rep)
	if cfg.ui {
		if err := d.serveConsole(ctx, dir, logFile); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// serveConsole serves the web console on the demo's database until ctx
// ends (Ctrl-C), which is then the demo's normal end.
func (d *demo) serveConsole(ctx context.Context, dir string, logs io.Writer) error {
	b := &backend{name: "sqlite", label: "database " + filepath.Join(dir, "ferry.db"), store: d.drv, inbox: d.drv}
	ui, err := startUI(b, uiSettings{addr: d.cfg.uiAddr, feed: "default", groups: demoGroup}, logs)
	if err != nil {
		return err
	}
	w := d.cfg.out
	fmt.Fprintf(w, "\nThe console, on the demo's data: %s#token=%s\n", ui.console, ui.token)
	fmt.Fprintf(w, "  (its JSON API: %s; actions need the token in the address). Ctrl-C to stop", ui.url)
	if d.cfg.dir == "" && !d.cfg.keep {
		fmt.Fprintf(w, " and remove %s", dir)
	}
	fmt.Fprintln(w, ".")
	errc := make(chan error, 1)
	go func() { errc <- ui.srv.Serve(ui.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("the console stopped: %w", err)
	case <-ctx.Done():
	}
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = ui.srv.Shutdown(stop)
	fmt.Fprintln(w, "console stopped")
	return nil
}

func (d *demo) createTables(ctx context.Context) error {
	_, err := d.drv.DB().ExecContext(ctx, `
CREATE TABLE orders (
    id           INTEGER PRIMARY KEY,
    customer     TEXT    NOT NULL,
    amount_cents INTEGER NOT NULL
);
-- The consumer's projection: per customer, how many orders and how much.
CREATE TABLE customer_totals (
    customer    TEXT    PRIMARY KEY,
    orders      INTEGER NOT NULL,
    total_cents INTEGER NOT NULL,
    last_seq    INTEGER NOT NULL
);
-- Every application of an event, to count double effects from the data.
CREATE TABLE applications (event_id TEXT NOT NULL, order_id INTEGER NOT NULL);
-- Events that arrived out of their customer's order.
CREATE TABLE order_violations (customer TEXT NOT NULL, want_seq INTEGER NOT NULL, got_seq INTEGER NOT NULL);`)
	return err
}

// produce runs the producers and returns when every order is committed.
func (d *demo) produce(ctx context.Context) error {
	var next atomic.Int64
	start := time.Now()
	errs := make(chan error, d.cfg.producers)
	var wg sync.WaitGroup
	for p := range d.cfg.producers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(d.cfg.seed, uint64(p)))
			for {
				i := next.Add(1)
				if i > int64(d.cfg.events) {
					return
				}
				if d.cfg.rate > 0 {
					due := start.Add(time.Duration(float64(i) / float64(d.cfg.rate) * float64(time.Second)))
					if wait := time.Until(due); wait > 0 {
						select {
						case <-ctx.Done():
							return
						case <-time.After(wait):
						}
					}
				}
				customer := fmt.Sprintf("customer-%04d", rng.IntN(d.cfg.keys))
				if err := d.placeOrder(ctx, customer, 100+rng.Int64N(99900)); err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				d.produced.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// placeOrder is what an application does: its own write and the event, in
// one transaction.
func (d *demo) placeOrder(ctx context.Context, customer string, amount int64) error {
	tx, err := d.drv.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, `INSERT INTO orders (customer, amount_cents) VALUES (?, ?)`, customer, amount)
	if err != nil {
		return err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return err
	}
	payload, err := json.Marshal(order{OrderID: id, Customer: customer, AmountCents: amount})
	if err != nil {
		return err
	}
	if err := d.client.EmitTx(ctx, tx, &ferry.Event{Topic: "orders", Key: customer, Type: "OrderPlaced", ContentType: "application/json", Payload: payload}); err != nil {
		return err
	}
	return tx.Commit()
}

var lineMu sync.Mutex

// line prints a message above the progress line.
func (d *demo) line(s string) {
	lineMu.Lock()
	defer lineMu.Unlock()
	if d.cfg.tty {
		fmt.Fprintf(d.cfg.out, "\r\x1b[2K  %s\n", s)
		return
	}
	fmt.Fprintf(d.cfg.out, "  %s\n", s)
}

func (d *demo) progress(s string) {
	lineMu.Lock()
	defer lineMu.Unlock()
	if d.cfg.tty {
		fmt.Fprintf(d.cfg.out, "\r\x1b[2K  %s", s)
		return
	}
	fmt.Fprintf(d.cfg.out, "  %s\n", s)
}
