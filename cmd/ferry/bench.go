package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// cmdBench measures the relay on this machine: how fast it drains a
// backlog into JetStream, and the commit-to-receive latency at a fixed
// rate. Each run uses a fresh schema and stream and removes them after.
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	mode, err := pickSubcommand("bench", args, []subcommand{
		{"drain", "how fast the relay drains a backlog into JetStream"},
		{"latency", "producer commit → received from JetStream, at a rate"},
		{"consume", "a consumer applying a backlog: one event per transaction, batched, HandleBatch, next to the ceiling"},
		{"settle", "handler commit → AwaitSettled returns"},
		{"ingest", "a JetStream source ingesting a backlog into an inbox"},
		{"e2e", "producer commit → relay → JetStream → source → inbox → consumer commit"},
	}, stdout)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			err = fmt.Errorf("%w (the side-by-side comparison with Watermill, River and naive polling is the bench module: cd bench && go run ./cmd/ferry-bench --quick)", err)
		}
		return err
	}
	f := newFlags("bench "+mode, stderr)
	var db dbFlags
	db.register(f)
	var natsURL string
	var events, keys, batch, rate, producers int
	var duration, poll time.Duration
	var keep bool
	var cpuProfile string
	f.String(&natsURL, "nats-url", "FERRY_NATS_URL", nats.DefaultURL, "NATS server URL")
	f.Int(&events, "events", "FERRY_BENCH_EVENTS", 100000, "drain: backlog size")
	f.Int(&keys, "keys", "FERRY_BENCH_KEYS", 500, "distinct keys")
	f.Int(&batch, "batch", "FERRY_BATCH_SIZE", 1000, "relay batch size")
	f.Int(&rate, "rate", "FERRY_BENCH_RATE", 1000, "latency: events per second, one per transaction")
	f.Int(&producers, "producers", "FERRY_BENCH_PRODUCERS", 8, "producer connections")
	f.Duration(&duration, "duration", "FERRY_BENCH_DURATION", 20*time.Second, "latency: how long to produce")
	f.Duration(&poll, "poll-interval", "FERRY_POLL_INTERVAL", 500*time.Millisecond, "relay poll interval")
	f.Bool(&keep, "keep", "FERRY_BENCH_KEEP", false, "keep the schema and stream afterwards")
	f.String(&cpuProfile, "cpuprofile", "FERRY_BENCH_CPUPROFILE", "", "write a CPU profile of the run to this file")
	var workers int
	f.Int(&workers, "workers", "FERRY_BENCH_WORKERS", 8, "consume/settle: consumer workers")
	var consumerBatch int
	f.Int(&consumerBatch, "consumer-batch", "FERRY_BENCH_CONSUMER_BATCH", 32, "consume: the batched mode's ConsumerConfig.BatchSize (the other mode runs one event per transaction)")
	var findMax bool
	f.Bool(&findMax, "find-max", "FERRY_BENCH_FIND_MAX", false, "e2e: first find the highest rate the pipeline sustains, then measure at --rate and at half that maximum")
	var modes string
	f.String(&modes, "modes", "FERRY_BENCH_MODES", "ceiling,one,batch,batch-savepoints,handlebatch", "consume: which runs, in this order (ceiling: the machine's ceiling; one: one event per transaction; batch: batches (savepoints on failure, the default); batch-savepoints: batches with SavepointEach; handlebatch: batches with HandleBatch)")
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	if cpuProfile != "" {
		pf, err := os.Create(cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if isMySQLURL(db.url) {
		return benchMySQL(ctx, stdout, stderr, mode, &db, natsURL, benchRun{events: events, keys: keys, batch: batch, rate: rate,
			producers: producers, duration: duration, poll: poll, keep: keep,
			workers: workers, consumerBatch: consumerBatch, modes: strings.Split(modes, ",")})
	}
	schema := fmt.Sprintf("ferrybench_%d", time.Now().UnixNano()%1e9)
	db.schema = schema
	pool, drv, err := db.openPG(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer func() {
		if !keep {
			_, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		}
	}()
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		return err
	}
	if mode == "consume" || mode == "settle" {
		fmt.Fprintf(stdout, "ferry bench %s: PostgreSQL %s, GOMAXPROCS %d, workers %d, keys %d\n", mode, serverVersion(ctx, pool), runtime.GOMAXPROCS(0), workers, keys)
		if mode == "consume" {
			return benchConsume(ctx, stdout, pgBench(pool, drv), events, keys, workers, consumerBatch, strings.Split(modes, ","))
		}
		return benchSettle(ctx, stdout, pgBench(pool, drv), events, keys, workers, rate)
	}
	bs, err := openBenchStream(ctx, natsURL, keep)
	if err != nil {
		return err
	}
	defer bs.close()
	nc, sink, js, stream, prefix := bs.nc, bs.sink, bs.js, bs.stream, bs.prefix
	client, err := ferry.NewClient(drv, nil)
	if err != nil {
		return err
	}
	// e2e's sink stamps the events it publishes (its breakdown by stage).
	var relaySink ferrysink.Sink = sink
	stamps := &stageStamps{}
	if mode == "e2e" {
		relaySink = &stampedSink{Sink: sink, stamps: stamps}
	}
	relay, err := ferry.NewRelay(drv, relaySink, &ferry.RelayConfig{BatchSize: batch, PollInterval: poll, Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ferry bench %s: PostgreSQL %s, NATS %s, GOMAXPROCS %d, batch %d, keys %d\n", mode, serverVersion(ctx, pool), nc.ConnectedServerVersion(), runtime.GOMAXPROCS(0), batch, keys)
	if mode == "e2e" {
		return benchE2E(ctx, stdout, pool, drv, client, relay, stamps, js, stream, prefix, rate, duration, keys, producers, workers, consumerBatch, findMax)
	}
	if mode == "ingest" {
		return benchIngest(ctx, stdout, drv, sink, js, stream, prefix, events, keys)
	}
	if mode == "drain" {
		return benchDrain(ctx, stdout, client, relay, js, stream, events, keys, producers)
	}
	return benchLatency(ctx, stdout, pgEmitTx(pool, client), relay, nc, prefix, rate, duration, keys, producers)
}

// benchStream is a run's JetStream stream, removed after the run unless
// it is kept.
type benchStream struct {
	nc             *nats.Conn
	sink           *ferrynats.Sink
	js             jetstream.JetStream
	stream, prefix string
	close          func()
}

func openBenchStream(ctx context.Context, natsURL string, keep bool) (*benchStream, error) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return nil, fmt.Errorf("cannot reach NATS at --nats-url / FERRY_NATS_URL (%s): %w", natsURL, err)
	}
	stream := "FERRYBENCH_" + strconv.Itoa(int(time.Now().UnixNano()%1e9))
	prefix := "ferrybench" + strconv.Itoa(int(time.Now().UnixNano()%1e9))
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	if err != nil {
		nc.Close()
		return nil, err
	}
	js, _ := jetstream.New(nc)
	return &benchStream{nc: nc, sink: sink, js: js, stream: stream, prefix: prefix, close: func() {
		_ = sink.Close(context.WithoutCancel(ctx))
		if !keep {
			_ = js.DeleteStream(context.WithoutCancel(ctx), stream)
		}
		nc.Close()
	}}, nil
}

func serverVersion(ctx context.Context, pool *pgxpool.Pool) string {
	var v string
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&v)
	return v
}

func payload(i int) []byte {
	return []byte(fmt.Sprintf(`{"order":%d,"amount":%d,"note":"%0200d"}`, i, i%977, 0))
}

// payloadOrder reads back the number payload gave an event, without
// decoding the JSON.
func payloadOrder(p []byte) (int, bool) {
	rest, ok := bytes.CutPrefix(p, []byte(`{"order":`))
	if !ok {
		return 0, false
	}
	n := 0
	for k, c := range rest {
		if c < '0' || c > '9' {
			return n, k > 0
		}
		n = n*10 + int(c-'0')
	}
	return 0, false
}

// benchDrain fills a backlog, then times the relay publishing all of it.
func benchDrain[TTx any](ctx context.Context, w io.Writer, c *ferry.Client[TTx], relay *ferry.Relay, js jetstream.JetStream, stream string, n, keys, producers int) error {
	fillStart := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				first := int(next.Add(100)) - 100
				if first >= n {
					return
				}
				evs := make([]*ferry.Event, min(100, n-first))
				for j := range evs {
					i := first + j
					evs[j] = &ferry.Event{Topic: "orders", Key: "customer-" + strconv.Itoa(i%keys), Type: "OrderPlaced", ContentType: "application/json", Payload: payload(i)}
				}
				if err := c.Emit(ctx, evs...); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Fprintf(w, "backlog: %d events in %v (%.0f events/s, 100 per transaction)\n", n, time.Since(fillStart).Round(time.Millisecond), float64(n)/time.Since(fillStart).Seconds())

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cpu0 := cpuTime()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	for {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs >= uint64(n) {
			break
		}
		select {
		case err := <-done:
			return fmt.Errorf("relay stopped early: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	cancel()
	<-done
	fmt.Fprintf(w, "drain: %d events in %v = %.0f events/s; this process (relay + JetStream client) used %.2f CPU-s, %.2f CPU-s per 10k events; peak RSS %d MiB\n",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), cpu.Seconds(), cpu.Seconds()*10000/float64(n), peakRSS()>>20)
	return nil
}

// benchLatency produces at a fixed rate, one event per transaction, and
// measures commit -> receipt by a JetStream subscriber, plus intended send
// time -> receipt (which also counts producer stalls: no coordinated omission).
func benchLatency(ctx context.Context, w io.Writer, emitTx func(context.Context, *ferry.Event) error, relay *ferry.Relay, nc *nats.Conn, prefix string, rate int, d time.Duration, keys, producers int) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()

	n := int(d.Seconds() * float64(rate))
	received := newBenchArrivals(n)
	sub, err := nc.Subscribe(prefix+".>", func(m *nats.Msg) {
		now := time.Now().UnixNano()
		if ev, err := ferrynats.Decode(m); err == nil {
			received.record(&ev, now)
		}
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	time.Sleep(time.Second) // let the relay take its lease
	p := produceAt(ctx, w, emitTx, n, rate, keys, producers)
	received.await(n, 30*time.Second)
	cancel()
	<-done
	fmt.Fprintf(w, "latency at %d events/s for %v: %d of %d received\n", rate, d, received.got.Load(), n)
	return p.report(w, received, "receive")
}

// benchArrivals records when each bench event arrived: the events of Type
// prefix, numbered by their payload's "order" (payload). One type, as
// most services' events have few: a consumer's per-type costs see what
// they would see there.
type benchArrivals struct {
	prefix string
	at     []atomic.Int64
	got    atomic.Int64
}

func newBenchArrivals(n int) *benchArrivals { return newPhaseArrivals("Bench", n) }

// newPhaseArrivals records the events of Type prefix (a phase of a run
// that produces several times).
func newPhaseArrivals(prefix string, n int) *benchArrivals {
	return &benchArrivals{prefix: prefix, at: make([]atomic.Int64, n)}
}

func (a *benchArrivals) record(ev *ferry.Event, now int64) {
	if ev.Type != a.prefix {
		return
	}
	i, ok := payloadOrder(ev.Payload)
	if !ok || i >= len(a.at) {
		return
	}
	if a.at[i].CompareAndSwap(0, now) {
		a.got.Add(1)
	}
}

// await waits until n events arrived, at most d.
func (a *benchArrivals) await(n int, d time.Duration) {
	deadline := time.Now().Add(d)
	for a.got.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// production is when each bench event was meant to be and was committed.
type production struct {
	intended  []int64
	committed []atomic.Int64
}

// produceAt commits n events, one per transaction, at rate over
// producers connections, each event i at its intended time.
func produceAt(ctx context.Context, w io.Writer, emitTx func(context.Context, *ferry.Event) error, n, rate, keys, producers int) *production {
	return producePhase(ctx, w, emitTx, "Bench", n, rate, keys, producers)
}

// pgEmitTx emits an event in a transaction of its own on pool, as an
// application does.
func pgEmitTx(pool *pgxpool.Pool, c *ferry.Client[pgx.Tx]) func(context.Context, *ferry.Event) error {
	return func(ctx context.Context, ev *ferry.Event) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return c.EmitTx(ctx, tx, ev) })
	}
}

// sqlEmitTx is pgEmitTx for a database/sql pool.
func sqlEmitTx(db *sql.DB, c *ferry.Client[*sql.Tx]) func(context.Context, *ferry.Event) error {
	return func(ctx context.Context, ev *ferry.Event) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := c.EmitTx(ctx, tx, ev); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
}

// producePhase is produceAt for events of Type prefix, numbered by payload.
func producePhase(ctx context.Context, w io.Writer, emitTx func(context.Context, *ferry.Event) error, prefix string, n, rate, keys, producers int) *production {
	p := &production{intended: make([]int64, n), committed: make([]atomic.Int64, n)}
	start := time.Now()
	for i := range p.intended {
		p.intended[i] = start.Add(time.Duration(i) * time.Second / time.Duration(rate)).UnixNano()
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range producers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if wait := time.Until(time.Unix(0, p.intended[i])); wait > 0 {
					time.Sleep(wait)
				}
				ev := &ferry.Event{Topic: "orders", Key: "customer-" + strconv.Itoa(rand.IntN(keys)), Type: prefix, Payload: payload(i)}
				err := emitTx(ctx, ev)
				if err != nil {
					fmt.Fprintln(w, "producer:", err)
					return
				}
				p.committed[i].Store(time.Now().UnixNano())
			}
		})
	}
	wg.Wait()
	return p
}

// report prints commit → arrival and intended → arrival percentiles.
func (p *production) report(w io.Writer, a *benchArrivals, what string) error {
	fromCommit, fromIntent := p.latencies(a)
	fmt.Fprintf(w, "  commit -> %s:   %s\n", what, percentiles(fromCommit))
	fmt.Fprintf(w, "  intended -> %s: %s\n", what, percentiles(fromIntent))
	if len(fromCommit) < len(p.intended) {
		return fmt.Errorf("%d events did not arrive", len(p.intended)-len(fromCommit))
	}
	return nil
}

// latencies are, for the events that arrived, commit → arrival and
// intended → arrival.
func (p *production) latencies(a *benchArrivals) (fromCommit, fromIntent []time.Duration) {
	for i := range p.intended {
		r, cm := a.at[i].Load(), p.committed[i].Load()
		if r == 0 || cm == 0 {
			continue
		}
		fromCommit = append(fromCommit, time.Duration(max(0, r-cm)))
		fromIntent = append(fromIntent, time.Duration(r-p.intended[i]))
	}
	return fromCommit, fromIntent
}

func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no samples"
	}
	slices.Sort(ds)
	p := func(q float64) time.Duration {
		return ds[min(len(ds)-1, int(q*float64(len(ds))))].Round(10 * time.Microsecond)
	}
	return fmt.Sprintf("p50 %v  p90 %v  p99 %v  max %v", p(0.50), p(0.90), p(0.99), ds[len(ds)-1].Round(10*time.Microsecond))
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func peakRSS() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Maxrss * 1024
}
