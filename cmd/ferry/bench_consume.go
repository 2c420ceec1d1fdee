package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

func benchConsumer[TTx any](db *benchDB[TTx], drv ferrydriver.Inbox[TTx], group, table string, workers, batch int, multiRow bool, sp bool, onCommit func(ev *ferry.Event)) (*ferry.Consumer[TTx], error) {
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: group, Workers: workers, BatchSize: batch, SavepointEach: sp, PollInterval: 20 * time.Millisecond,
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
			r, err = benchConsumeMode(ctx, db, "consume, one event per transaction", "bench1", n, keys, workers, 1, false, false)
		case "batch":
			r, err = benchConsumeMode(ctx, db, fmt.Sprintf("consume, batches of up to %d", batch), fmt.Sprintf("bench%d", batch), n, keys, workers, batch, false, false)
		case "batch-savepoints":
			r, err = benchConsumeMode(ctx, db, fmt.Sprintf("consume, batches of %d, SavepointEach", batch), fmt.Sprintf("bench%dsp", batch), n, keys, workers, batch, false, true)
		case "handlebatch":
			r, err = benchConsumeMode(ctx, db, fmt.Sprintf("consume, batches of %d, HandleBatch", batch), fmt.Sprintf("bench%dhb", batch), n, keys, workers, batch, true, false)
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
func benchConsumeMode[TTx any](ctx context.Context, db *benchDB[TTx], name, group string, n, keys, workers, batch int, multiRow bool, sp bool) (consumeResult, error) {
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
