package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// benchEvents returns n events over keys with per-key Seq.
func benchEvents(n, keys int) []*ferry.Event {
	out := make([]*ferry.Event, n)
	seq := map[string]int64{}
	for i := range out {
		k := "customer-" + strconv.Itoa(i%keys)
		seq[k]++
		out[i] = &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: k, Type: "OrderPlaced", Seq: seq[k], Payload: payload(i), CreatedAt: time.Now()}
	}
	return out
}

// projection creates table name in schema, the table the bench handler
// writes: one row per customer, updated by each event (the exactly-once
// effect). It returns the table's quoted name.
func projection(ctx context.Context, pool *pgxpool.Pool, schema, name string) (string, error) {
	t := pgx.Identifier{schema, name}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE TABLE `+t+` (customer text PRIMARY KEY, orders bigint NOT NULL, last_seq bigint NOT NULL)`)
	return t, err
}

// upsert is the bench handler's one statement: the projection row of the
// event's customer, counted.
func upsert(table string) string {
	return `INSERT INTO ` + table + ` (customer, orders, last_seq) VALUES ($1, 1, $2)
		ON CONFLICT (customer) DO UPDATE SET orders = ` + table + `.orders + 1, last_seq = excluded.last_seq`
}

// benchDriver is what ferry bench consume and settle need of a backend's
// driver: an inbox that batches and waits for settlement.
type benchDriver[TTx any] interface {
	ferrydriver.Inbox[TTx]
	ferrydriver.InboxBatcher[TTx]
	ferrydriver.Settler
}

// benchDB is the database ferry bench consume and settle run on: Ferry's
// driver, and the projection the bench handler writes, in the database's
// dialect.
type benchDB[TTx any] struct {
	drv benchDriver[TTx]
	// server names the database's processes, whose CPU time is reported
	// when they run on this machine.
	server string
	// create makes a projection table: one row per customer, updated by
	// each event (the exactly-once effect). It returns the table's quoted
	// name.
	create func(ctx context.Context, name string) (string, error)
	// upsert counts one event in the projection, inside tx.
	upsert func(ctx context.Context, tx TTx, table, key string, seq int64) error
	// upsertMany counts events of distinct keys in one statement.
	upsertMany func(ctx context.Context, tx TTx, table string, keys []string, seqs []int64) error
	// alone runs upsert in a transaction of its own, without Ferry.
	alone func(ctx context.Context, table, key string, seq int64) error
	// total sums the projection's counts.
	total func(ctx context.Context, table string) (int64, error)
}

// pgBench is a benchDB on PostgreSQL.
func pgBench(pool *pgxpool.Pool, drv *ferrypg.Driver[pgx.Tx]) *benchDB[pgx.Tx] {
	return &benchDB[pgx.Tx]{
		drv:    drv,
		server: "postgres",
		create: func(ctx context.Context, name string) (string, error) {
			return projection(ctx, pool, drv.Schema(), name)
		},
		upsert: func(ctx context.Context, tx pgx.Tx, table, key string, seq int64) error {
			_, err := tx.Exec(ctx, upsert(table), key, seq)
			return err
		},
		upsertMany: func(ctx context.Context, tx pgx.Tx, table string, keys []string, seqs []int64) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (customer, orders, last_seq) SELECT c, 1, s FROM unnest($1::text[], $2::bigint[]) u(c, s)
				ON CONFLICT (customer) DO UPDATE SET orders = `+table+`.orders + 1, last_seq = excluded.last_seq`, keys, seqs)
			return err
		},
		alone: func(ctx context.Context, table, key string, seq int64) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, upsert(table), key, seq)
				return err
			})
		},
		total: func(ctx context.Context, table string) (n int64, err error) {
			err = pool.QueryRow(ctx, `SELECT COALESCE(sum(orders), 0) FROM `+table).Scan(&n)
			return n, err
		},
	}
}

func benchConsumer[TTx any](db *benchDB[TTx], drv ferrydriver.Inbox[TTx], group, table string, workers, batch int, multiRow bool, sp ferry.SavepointMode, onCommit func(ev *ferry.Event)) (*ferry.Consumer[TTx], error) {
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: group, Workers: workers, BatchSize: batch, Savepoints: sp, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	if multiRow {
		// HandleBatch: one statement for all the batch's events of the type
		// (of different keys, so one row each).
		c.HandleEventBatch("OrderPlaced", func(ctx context.Context, tx TTx, evs []*ferry.Event) error {
			keys, seqs := make([]string, len(evs)), make([]int64, len(evs))
			for i, ev := range evs {
				keys[i], seqs[i] = ev.Key, ev.Seq
			}
			return db.upsertMany(ctx, tx, table, keys, seqs)
		})
		return c, nil
	}
	c.HandleAll(func(ctx context.Context, tx TTx, ev *ferry.Event) error {
		err := db.upsert(ctx, tx, table, ev.Key, ev.Seq)
		if err == nil && onCommit != nil {
			onCommit(ev)
		}
		return err
	})
	return c, nil
}

// consumeResult is one line of ferry bench consume.
type consumeResult struct {
	name     string
	n        int
	elapsed  time.Duration
	txLat    string        // one transaction, begin to commit
	dbCPU    time.Duration // the database's CPU time, all processes
	hasDBCPU bool
}

func (r consumeResult) String() string {
	cpu := "n/a (not a local server)"
	if r.hasDBCPU {
		cpu = (r.dbCPU * 10000 / time.Duration(r.n)).Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%-38s %7.0f events/s (%d in %v); database CPU %s per 10k events; transactions: %s",
		r.name+":", float64(r.n)/r.elapsed.Seconds(), r.n, r.elapsed.Round(time.Millisecond), cpu, r.txLat)
}

// benchConsume measures, in one run, how fast a consumer applies a backlog
// with exactly-once effect (inbox + projection update in one transaction),
// one event per transaction and batched, next to the machine's ceiling for
// the same work without an inbox: workers clients each committing one
// upsert per transaction.
func benchConsume[TTx any](ctx context.Context, w io.Writer, db *benchDB[TTx], n, keys, workers, batch int, modes []string) error {
	for _, mode := range modes {
		var r consumeResult
		var err error
		switch mode {
		case "ceiling":
			r, err = benchCeiling(ctx, db, n, keys, workers)
		case "one":
			r, err = benchConsumeMode(ctx, db, "consume, one event per transaction", "bench1", n, keys, workers, 1, false, ferry.SavepointsOnFailure)
		case "batch":
			r, err = benchConsumeMode(ctx, db, fmt.Sprintf("consume, batches of up to %d", batch), fmt.Sprintf("bench%d", batch), n, keys, workers, batch, false, ferry.SavepointsOnFailure)
		case "batch-savepoints":
			r, err = benchConsumeMode(ctx, db, fmt.Sprintf("consume, batches of %d, SavepointsAlways", batch), fmt.Sprintf("bench%dsp", batch), n, keys, workers, batch, false, ferry.SavepointsAlways)
		case "handlebatch":
			r, err = benchConsumeMode(ctx, db, fmt.Sprintf("consume, batches of %d, HandleBatch", batch), fmt.Sprintf("bench%dhb", batch), n, keys, workers, batch, true, ferry.SavepointsOnFailure)
		default:
			return fmt.Errorf("--modes: %q is not one of ceiling, one, batch, batch-savepoints, handlebatch", mode)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(w, r)
	}
	return nil
}

// benchCeiling is the same upserts without Ferry: workers clients, one
// transaction each.
func benchCeiling[TTx any](ctx context.Context, db *benchDB[TTx], n, keys, workers int) (consumeResult, error) {
	t, err := db.create(ctx, "ceiling")
	if err != nil {
		return consumeResult{}, err
	}
	evs := benchEvents(n, keys)
	var next atomic.Int64
	lat := make([]time.Duration, n)
	cpu0, hasCPU := processCPU(db.server)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := db.alone(ctx, t, evs[i].Key, evs[i].Seq); err != nil {
					errs <- err
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return consumeResult{}, err
	}
	cpu1, _ := processCPU(db.server)
	return consumeResult{name: fmt.Sprintf("ceiling, %d clients, 1 upsert/tx", workers), n: n, elapsed: elapsed, txLat: percentiles(lat),
		dbCPU: cpu1 - cpu0, hasDBCPU: hasCPU}, nil
}

// benchConsumeMode ingests n events for a fresh group, then runs a
// consumer until the projection counts all of them.
func benchConsumeMode[TTx any](ctx context.Context, db *benchDB[TTx], name, group string, n, keys, workers, batch int, multiRow bool, sp ferry.SavepointMode) (consumeResult, error) {
	table, err := db.create(ctx, "projection_"+group)
	if err != nil {
		return consumeResult{}, err
	}
	timed := &timedInbox[TTx]{benchDriver: db.drv}
	c, err := benchConsumer(db, timed, group, table, workers, batch, multiRow, sp, nil)
	if err != nil {
		return consumeResult{}, err
	}
	evs := benchEvents(n, keys)
	for i := 0; i < n; i += 1000 {
		if _, err := c.Ingest(ctx, evs[i:min(i+1000, n)]); err != nil {
			return consumeResult{}, err
		}
	}
	cpu0, hasCPU := processCPU(db.server)
	start := time.Now()
	stop := runConsumer(ctx, c)
	var total int64
	for {
		if total, err = db.total(ctx, table); err != nil {
			return consumeResult{}, err
		}
		if total >= int64(n) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	cpu1, _ := processCPU(db.server)
	if err := stop(); err != nil {
		return consumeResult{}, err
	}
	if total != int64(n) {
		return consumeResult{}, fmt.Errorf("%s: %d effects for %d events: not exactly once", name, total, n)
	}
	return consumeResult{name: name, n: n, elapsed: elapsed, dbCPU: cpu1 - cpu0, hasDBCPU: hasCPU, txLat: timed.percentiles()}, nil
}

// timedInbox times the consumer's transactions, begin to commit.
type timedInbox[TTx any] struct {
	benchDriver[TTx]
	mu  sync.Mutex
	lat []time.Duration
}

func (t *timedInbox[TTx]) RunInTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	start := time.Now()
	err := t.benchDriver.RunInTx(ctx, fn)
	d := time.Since(start)
	t.mu.Lock()
	t.lat = append(t.lat, d)
	t.mu.Unlock()
	return err
}

func (t *timedInbox[TTx]) percentiles() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Sprintf("%d, %s", len(t.lat), percentiles(t.lat))
}

// postgresCPU is the CPU time of this machine's PostgreSQL processes
// (processCPU).
func postgresCPU() (time.Duration, bool) { return processCPU("postgres") }

// processCPU sums the CPU time (user and system) of the processes named
// name on this machine, from /proc; false where there is none to read.
func processCPU(name string) (time.Duration, bool) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	var ticks int64
	found := false
	for _, d := range dirs {
		if d.Name()[0] < '0' || d.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15)
		open, closing := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || closing < open || string(b[open+1:closing]) != name {
			continue
		}
		f := strings.Fields(string(b[closing+2:]))
		if len(f) < 15 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		cu, _ := strconv.ParseInt(f[13], 10, 64) // children's, reaped: the postmaster's exited backends
		cs, _ := strconv.ParseInt(f[14], 10, 64)
		ticks += u + s + cu + cs
		found = true
	}
	return time.Duration(ticks) * time.Second / 100, found // USER_HZ is 100 on Linux
}

// benchSettle ingests events at rate and measures how long after the
// handler's transaction commits AwaitSettled returns.
func benchSettle[TTx any](ctx context.Context, w io.Writer, db *benchDB[TTx], n, keys, workers, rate int) error {
	if n > 5000 {
		n = 2000
	}
	table, err := db.create(ctx, "projection")
	if err != nil {
		return err
	}
	var mu sync.Mutex
	handled := map[uuid.UUID]time.Time{}
	c, err := benchConsumer(db, db.drv, "bench", table, workers, 1, false, ferry.SavepointsOnFailure, func(ev *ferry.Event) {
		mu.Lock()
		handled[ev.ID] = time.Now() // just before the commit
		mu.Unlock()
	})
	if err != nil {
		return err
	}
	stop := runConsumer(ctx, c)
	defer func() { _ = stop() }()
	evs := benchEvents(n, keys)
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i, ev := range evs {
		if wait := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); wait > 0 {
			time.Sleep(wait)
		}
		wg.Go(func() {
			done := make(chan struct{})
			go func() {
				defer close(done)
				s, err := ferry.AwaitSettled(ctx, db.drv, "bench", []uuid.UUID{ev.ID}, 30*time.Second)
				if err == nil && !s.Done() {
					err = fmt.Errorf("event %s not settled in 30 s", ev.ID)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				lat[i] = time.Since(handled[ev.ID])
				mu.Unlock()
			}()
			time.Sleep(5 * time.Millisecond) // the waiter is in place before the event arrives
			if _, err := c.Ingest(ctx, []*ferry.Event{ev}); err != nil {
				errs <- err
			}
			<-done
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Fprintf(w, "settle: %d events at %d/s; handler commit -> AwaitSettled returns: %s\n", n, rate, percentiles(lat))
	return nil
}

// runConsumer runs c until stop is called, which returns what Run did.
func runConsumer[TTx any](ctx context.Context, c *ferry.Consumer[TTx]) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// benchIngest publishes n events to the stream, then times a JetStream
// source ingesting all of them into a group's inbox (a multi-row insert
// per batch, acknowledged after its commit), for each source batch size.
func benchIngest(ctx context.Context, w io.Writer, drv *ferrypg.Driver[pgx.Tx], sink *ferrynats.Sink, js jetstream.JetStream, stream, prefix string, n, keys int) error {
	evs := benchEvents(n, keys)
	for i := 0; i < n; i += 1000 {
		for j, err := range sink.Publish(ctx, evs[i:min(i+1000, n)]) {
			if err != nil {
				return fmt.Errorf("publish event %d: %w", i+j, err)
			}
		}
	}
	for _, batch := range []int{ferrynats.DefaultBatch, 1000} {
		group := "ingest" + strconv.Itoa(batch)
		c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: group, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		src, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{Stream: stream, Durable: group, SubjectPrefix: prefix, Batch: batch,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		var ingested atomic.Int64
		done := make(chan struct{})
		rctx, cancel := context.WithCancel(ctx)
		cpu0, hasCPU := postgresCPU()
		start := time.Now()
		var elapsed time.Duration
		runErr := make(chan error, 1)
		go func() {
			runErr <- src.Run(rctx, func(ctx context.Context, events []*ferry.Event) error {
				if _, err := c.Ingest(ctx, events); err != nil {
					return err
				}
				if ingested.Add(int64(len(events))) >= int64(n) {
					select {
					case <-done:
					default:
						elapsed = time.Since(start)
						close(done)
					}
				}
				return nil
			})
		}()
		select {
		case <-done:
		case err := <-runErr:
			cancel()
			return fmt.Errorf("source stopped after %d of %d events: %v", ingested.Load(), n, err)
		case <-time.After(5 * time.Minute):
			cancel()
			return fmt.Errorf("ingested %d of %d events in 5 minutes", ingested.Load(), n)
		}
		cpu1, _ := postgresCPU()
		cancel()
		if err := <-runErr; err != nil {
			return err
		}
		cpu := "n/a (not a local server)"
		if hasCPU {
			cpu = ((cpu1 - cpu0) * 10000 / time.Duration(n)).Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "ingest from JetStream, source batch %4d: %7.0f events/s (%d in %v); database CPU %s per 10k events\n",
			batch, float64(n)/elapsed.Seconds(), n, elapsed.Round(time.Millisecond), cpu)
	}
	return nil
}

// benchE2E produces at rate for d and times each event from its
// producer's commit to the commit of the consumer transaction that applied
// it: outbox → relay → JetStream → source → inbox → handler. With findMax
// it first looks for the highest rate the pipeline sustains (findMaxRate),
// then measures at rate and at half that maximum, through one pipeline.
func benchE2E(ctx context.Context, w io.Writer, pool *pgxpool.Pool, drv *ferrypg.Driver[pgx.Tx], client *ferry.Client[pgx.Tx], relay *ferry.Relay,
	js jetstream.JetStream, stream, prefix string, rate int, d time.Duration, keys, producers, workers, batch int, findMax bool) error {
	table, err := projection(ctx, pool, drv.Schema(), "projection_e2e")
	if err != nil {
		return err
	}
	stamped := &commitStamper{Driver: drv}
	stamped.arrivals.Store(newBenchArrivals(0))
	c, err := ferry.NewConsumer(stamped, &ferry.ConsumerConfig{Group: "e2e", Workers: workers, BatchSize: batch, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		if _, err := tx.Exec(ctx, upsert(table), ev.Key, ev.Seq); err != nil {
			return err
		}
		stamped.note(ctx, ev)
		return nil
	})
	src, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{Stream: stream, Durable: "e2e", SubjectPrefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g sync.WaitGroup
	errs := make(chan error, 3)
	g.Go(func() { errs <- relay.Run(rctx) })
	g.Go(func() { errs <- c.Run(rctx) })
	g.Go(func() { errs <- c.Consume(rctx, src) })
	time.Sleep(time.Second) // let the relay take its lease
	phase := 0
	// run produces at r for dur and reports; it returns the intended →
	// applied p99 and whether every event was applied within settle of
	// the production's end.
	run := func(r int, dur, settle time.Duration, report bool) (time.Duration, bool) {
		phase++
		n := max(1, int(dur.Seconds()*float64(r)))
		applied := newPhaseArrivals(fmt.Sprintf("Bench%d.", phase), n)
		stamped.arrivals.Store(applied)
		p := producePhase(ctx, w, pgEmitTx(pool, client), applied.prefix, n, r, keys, producers)
		applied.await(n, settle)
		fromCommit, fromIntent := p.latencies(applied)
		all := len(fromCommit) == n
		// What is left drains before the next phase, which must not
		// start behind a backlog.
		applied.await(n, time.Minute)
		p99 := time.Duration(0)
		if len(fromIntent) > 0 {
			slices.Sort(fromIntent)
			p99 = fromIntent[min(len(fromIntent)-1, len(fromIntent)*99/100)]
		}
		if report {
			fmt.Fprintf(w, "end to end at %d events/s for %v (consumer: %d workers, batch size %d): %d of %d applied\n", r, dur, workers, batch, len(fromCommit), n)
			fmt.Fprintf(w, "  commit -> applied:   %s\n", percentiles(fromCommit))
			fmt.Fprintf(w, "  intended -> applied: %s\n", percentiles(fromIntent))
		}
		return p99, all
	}
	var runErr error
	if findMax {
		best := findMaxRate(w, func(r int) bool {
			p99, all := run(r, 4*time.Second, 3*time.Second, false)
			ok := all && p99 < time.Second
			fmt.Fprintf(w, "  %5d events/s: %s (intended -> applied p99 %v)\n", r, map[bool]string{true: "sustained", false: "not sustained"}[ok], p99.Round(time.Millisecond))
			return ok
		})
		fmt.Fprintf(w, "sustained maximum: about %d events/s (producers: one event per transaction, %d connections)\n", best, producers)
		if _, all := run(rate, d, 30*time.Second, true); !all {
			runErr = fmt.Errorf("events at %d/s did not all arrive within 30 s", rate)
		}
		if _, all := run(max(1, best/2), d, 30*time.Second, true); !all && runErr == nil {
			runErr = fmt.Errorf("events at %d/s did not all arrive within 30 s", best/2)
		}
	} else if _, all := run(rate, d, 30*time.Second, true); !all {
		runErr = fmt.Errorf("events at %d/s did not all arrive within 30 s", rate)
	}
	cancel()
	g.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return runErr
}

// findMaxRate steps the rate up by 500 events/s from 1,000 while sustained
// says the pipeline keeps up, then once by 250 past the last sustained
// rate; it returns the highest rate sustained (0: not even the first).
func findMaxRate(w io.Writer, sustained func(rate int) bool) int {
	fmt.Fprintln(w, "looking for the sustained maximum (4 s per step; sustained: every event applied, intended -> applied p99 under 1 s)")
	best := 0
	for r := 1000; r <= 100_000; r += 500 {
		if !sustained(r) {
			break
		}
		best = r
	}
	if best > 0 && sustained(best+250) {
		best += 250
	}
	return best
}

// commitStamper records, for each event its handlers applied, when the
// consumer transaction that applied it committed.
type commitStamper struct {
	*ferrypg.Driver[pgx.Tx]
	arrivals atomic.Pointer[benchArrivals]
}

type stampKey struct{}

// note is called by the handler: ev is applied in the transaction of ctx.
func (s *commitStamper) note(ctx context.Context, ev *ferry.Event) {
	if evs, ok := ctx.Value(stampKey{}).(*[]*ferry.Event); ok {
		*evs = append(*evs, ev)
	}
}

func (s *commitStamper) RunInTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var evs []*ferry.Event
	err := s.Driver.RunInTx(context.WithValue(ctx, stampKey{}, &evs), func(ctx context.Context, tx pgx.Tx) error {
		evs = evs[:0] // a rerun starts over
		return fn(ctx, tx)
	})
	if err == nil {
		now := time.Now().UnixNano()
		a := s.arrivals.Load()
		for _, ev := range evs {
			a.record(ev, now)
		}
	}
	return err
}
