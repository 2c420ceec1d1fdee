package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
)

// The consume scenario compares ways of applying events with exactly-once
// effect on PostgreSQL. Every consumer applies the same work per event, in
// the transaction that records the event as done:
//
//	INSERT INTO projection AS t (customer, orders, last_seq) VALUES ($key, 1, $seq)
//	ON CONFLICT (customer) DO UPDATE SET orders = t.orders + 1, last_seq = excluded.last_seq
//	RETURNING customer, orders, last_seq
//
// (one multi-row statement for Ferry's batch handler). The backlog is
// written before the consumer starts; the consumer runs in the child
// process, as relays do, so that its CPU time and peak RSS are its own.
// The projection counts what was applied (sum(orders) must be the backlog,
// each key's orders its number of events), and the child's pgx tracer
// keeps, for every committed transaction that applied events, what it
// applied (RETURNING gives each event's position in its key's commit
// order) and how long it took, BEGIN sent to COMMIT returned.

// AllConsumers lists the consume scenario's contenders in their default
// order.
var AllConsumers = []string{"ferry-inbox", "ferry-inbox-batch", "ferry-inbox-batch-handler", "river-jobcompletetx", "watermill-subscriber"}

// consumeGroup is the consumer group (Ferry, Watermill) of the scenario.
const consumeGroup = "bench"

// consumer is a consume-scenario contender, as seen from the driver
// process; it applies events in the child process (see buildConsumer).
type consumer interface {
	Name() string
	Describe() string
	OrderedPerKey() bool
	// schema is its own PostgreSQL schema.
	schema() string
	// keep lists the tables a reset keeps (migration bookkeeping).
	keep() []string
	// Setup creates its schema, its tables and the projection.
	Setup(ctx context.Context, e *env) error
	// Preload writes the backlog, consumer stopped.
	Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error
}

func newConsumer(name, prefix string) (consumer, error) {
	switch name {
	case "ferry-inbox":
		return &ferryInbox{prefix: prefix, name: name, batch: 1}, nil
	case "ferry-inbox-batch":
		return &ferryInbox{prefix: prefix, name: name, batch: inboxBatch}, nil
	case "ferry-inbox-batch-handler":
		return &ferryInbox{prefix: prefix, name: name, batch: inboxBatch, batchFn: true}, nil
	case "river-jobcompletetx":
		return &riverApply{prefix: prefix, cfg: riverApplyConfig}, nil
	case "watermill-subscriber":
		return &watermillSub{prefix: prefix}, nil
	}
	return nil, fmt.Errorf("unknown consumer %q (known: %s)", name, strings.Join(AllConsumers, ", "))
}

// buildConsumer is the child side of a consumer: the consumer under test
// over a traced pool, writing what it applied to c.stats when it stops.
func buildConsumer(ctx context.Context, c *childConfig) (runFunc, func(), error) {
	switch c.impl {
	case "ferry-inbox":
		return ferryInboxConsumer(ctx, c, 1, false)
	case "ferry-inbox-batch":
		return ferryInboxConsumer(ctx, c, inboxBatch, false)
	case "ferry-inbox-batch-handler":
		return ferryInboxConsumer(ctx, c, inboxBatch, true)
	case "river-jobcompletetx":
		return riverApplyConsumer(ctx, c, riverApplyConfig)
	case "watermill-subscriber":
		return watermillSubConsumer(ctx, c)
	}
	return nil, nil, fmt.Errorf("unknown consumer --impl %q", c.impl)
}

func isConsumer(impl string) bool { return slices.Contains(AllConsumers, impl) }

func projectionTable(schema string) string { return schema + ".projection" }

func createProjection(ctx context.Context, e *env, schema string) error {
	_, err := e.pool.Exec(ctx, `CREATE TABLE `+projectionTable(schema)+` (customer text PRIMARY KEY, orders bigint NOT NULL, last_seq bigint NOT NULL)`)
	return err
}

func upsertOne(table string) string {
	return `INSERT INTO ` + table + ` AS t (customer, orders, last_seq) VALUES ($1, 1, $2)
		ON CONFLICT (customer) DO UPDATE SET orders = t.orders + 1, last_seq = excluded.last_seq
		RETURNING customer, orders, last_seq`
}

func upsertMany(table string) string {
	return `INSERT INTO ` + table + ` AS t (customer, orders, last_seq) SELECT c, 1, s FROM unnest($1::text[], $2::bigint[]) u(c, s)
		ON CONFLICT (customer) DO UPDATE SET orders = t.orders + 1, last_seq = excluded.last_seq
		RETURNING customer, orders, last_seq`
}

// applyEvents runs the upsert for the events (customers[i], seqs[i]) in
// tx, one statement for one event, one multi-row statement for several
// (of different customers), and tells rec what each applied.
func applyEvents(ctx context.Context, tx pgx.Tx, rec *applyRecorder, table string, customers []string, seqs []int64) error {
	var rows pgx.Rows
	var err error
	if len(customers) == 1 {
		rows, err = tx.Query(ctx, upsertOne(table), customers[0], seqs[0])
	} else {
		rows, err = tx.Query(ctx, upsertMany(table), customers, seqs)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	var n int
	for rows.Next() {
		var customer string
		var pos, seq int64
		if err := rows.Scan(&customer, &pos, &seq); err != nil {
			return err
		}
		rec.record(tx.Conn(), customer, pos, seq)
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n != len(customers) {
		return fmt.Errorf("upsert of %d events returned %d rows", len(customers), n)
	}
	return nil
}

// applyOne decodes a benchmark payload and applies it.
func applyOne(ctx context.Context, tx pgx.Tx, rec *applyRecorder, table string, payload []byte) error {
	m, err := DecodePayload(payload)
	if err != nil {
		return err
	}
	return applyEvents(ctx, tx, rec, table, []string{KeyString(m.Key)}, []int64{m.Seq})
}

// applyRecorder is the consumer child's pgx tracer. It follows each
// connection's transactions (pgx sends "begin…" and "commit" through
// Exec, which it traces) and, for the ones that applied events, records
// on commit what they applied and how long they took; a rollback drops
// them. Savepoints are not followed: a handler rolled back to its
// savepoint (a failure; the bench's handlers do not fail) would still be
// counted.
type applyRecorder struct {
	mu      sync.Mutex
	open    map[*pgx.Conn]*openTx
	hist    *hdrhistogram.Histogram
	txs     int64
	events  int64
	outside int64 // applies seen outside a transaction (none expected)
	first   int64 // unix ns: BEGIN of the first applying transaction
	last    int64 // unix ns: COMMIT of the last one
	applied map[string][]applied
}

type openTx struct {
	begin   time.Time
	applies []appliedBy
}

type appliedBy struct {
	customer string
	a        applied
}

// applied is one committed apply: the event's per-key seq, at position
// pos (the key's orders after it) of the key's commit order.
type applied struct {
	Pos int64 `json:"p"`
	Seq int64 `json:"s"`
}

func newApplyRecorder() *applyRecorder {
	return &applyRecorder{open: map[*pgx.Conn]*openTx{}, hist: newHist(), applied: map[string][]applied{}}
}

type txStmtKey struct{}

func (r *applyRecorder) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	sql := data.SQL
	switch {
	case len(sql) >= 5 && strings.EqualFold(sql[:5], "begin"):
		r.mu.Lock()
		r.open[conn] = &openTx{begin: time.Now()}
		r.mu.Unlock()
		return context.WithValue(ctx, txStmtKey{}, "begin")
	case strings.EqualFold(sql, "commit"), strings.EqualFold(sql, "rollback"):
		return context.WithValue(ctx, txStmtKey{}, strings.ToLower(sql))
	}
	return ctx
}

func (r *applyRecorder) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	kind, _ := ctx.Value(txStmtKey{}).(string)
	if kind == "" || (kind == "begin" && data.Err == nil) {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.open[conn]
	delete(r.open, conn)
	if kind != "commit" || data.Err != nil || data.CommandTag.String() != "COMMIT" || t == nil || len(t.applies) == 0 {
		return
	}
	_ = r.hist.RecordValue(max(1, now.Sub(t.begin).Microseconds()))
	r.txs++
	r.events += int64(len(t.applies))
	if r.first == 0 || t.begin.UnixNano() < r.first {
		r.first = t.begin.UnixNano()
	}
	r.last = max(r.last, now.UnixNano())
	for _, a := range t.applies {
		r.applied[a.customer] = append(r.applied[a.customer], a.a)
	}
}

// TraceBatchStart implements pgx.BatchTracer: a consumer's BEGIN and
// COMMIT may travel in pipelines (Ferry's pgx driver sends BEGIN with the
// transaction's first statement and COMMIT with the inbox's record).
func (r *applyRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery follows a pipeline's BEGIN, COMMIT and ROLLBACK as
// TraceQueryStart and TraceQueryEnd follow those sent alone.
func (r *applyRecorder) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	qctx := r.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: data.SQL, Args: data.Args})
	r.TraceQueryEnd(qctx, conn, pgx.TraceQueryEndData{CommandTag: data.CommandTag, Err: data.Err})
}

func (r *applyRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

var _ pgx.BatchTracer = (*applyRecorder)(nil)

// record notes an apply in conn's open transaction.
func (r *applyRecorder) record(conn *pgx.Conn, customer string, pos, seq int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.open[conn]
	if t == nil {
		r.outside++
		return
	}
	t.applies = append(t.applies, appliedBy{customer: customer, a: applied{Pos: pos, Seq: seq}})
}

// consumeStats is what the consumer child reports when it stops (the
// --stats file).
type consumeStats struct {
	Tx         *Latency             `json:"tx,omitempty"`
	Txs        int64                `json:"txs"`
	Events     int64                `json:"events"`
	Outside    int64                `json:"outside_tx,omitempty"`
	FirstBegin int64                `json:"first_begin_unix_ns"`
	LastCommit int64                `json:"last_commit_unix_ns"`
	Applied    map[string][]applied `json:"applied"`
}

func (r *applyRecorder) write(path string) error {
	if path == "" {
		return nil
	}
	r.mu.Lock()
	s := consumeStats{Tx: summarize(r.hist, 0), Txs: r.txs, Events: r.events, Outside: r.outside, FirstBegin: r.first, LastCommit: r.last, Applied: r.applied}
	b, err := json.Marshal(&s)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// consumeEvents is the backlog: n events over keys, key k's i-th event
// with seq i.
func consumeEvents(n, keys int) []Meta {
	metas := make([]Meta, n)
	for g := range metas {
		metas[g] = Meta{G: int64(g), Key: g%keys + 1, Seq: int64(g/keys + 1)}
	}
	return metas
}

// runConsume runs one consume phase from a clean state: reset, backlog,
// ANALYZE, then the consumer child, timed until the projection counts
// every event (or applying stalls for the grace period, or the drain wait
// ends).
func (r *runner) runConsume(ctx context.Context, c consumer) (res Result) {
	n, keys := r.p.ConsumeEvents, r.p.ConsumeKeys
	name := c.Name()
	res = Result{Contender: name, Scenario: "consume", Param: "backlog=" + strconv.Itoa(n), Repeat: r.rep, Events: n, Keys: keys}
	if ctx.Err() != nil {
		res.Error = ctx.Err().Error()
		return res
	}
	r.logf("run %s consume backlog=%d over %d keys (repeat %d)", name, n, keys, r.rep)
	fail := func(err error) Result {
		res.Error = err.Error()
		return res
	}
	schema := c.schema()
	all, err := truncateSchema(ctx, r.env, schema, c.keep())
	if err != nil {
		return fail(fmt.Errorf("reset: %w", err))
	}
	if err := vacuumSchema(ctx, r.env, schema, all, r.p.Checkpoint); err != nil {
		return fail(fmt.Errorf("reset: %w", err))
	}
	t := time.Now()
	if err := c.Preload(ctx, r.env, rand.Uint64(), consumeEvents(n, keys)); err != nil {
		return fail(fmt.Errorf("preload: %w", err))
	}
	res.Note = fmt.Sprintf("preload %.2f s", time.Since(t).Seconds())
	if err := analyzeSchema(ctx, r.env, schema); err != nil {
		return fail(fmt.Errorf("analyze: %w", err))
	}

	r.phaseN++
	stats := filepath.Join(r.env.tmpDir, fmt.Sprintf("consume-%d.json", r.phaseN))
	args := []string{"--impl", name, "--schema", schema, "--stats", stats}
	if r.o.CPUProfiles {
		dir := filepath.Join(r.o.Out, "pprof")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fail(err)
		}
		args = append(args, "--cpuprofile", filepath.Join(dir, fmt.Sprintf("%s-consume-backlog%d-r%d.pprof", name, n, r.rep)))
	}
	fmt.Fprintf(r.relayLog, "=== %s %s consume backlog=%d repeat %d\n", time.Now().Format(time.RFC3339), name, n, r.rep)
	ch, err := r.startChild(args)
	if err != nil {
		return fail(err)
	}
	defer ch.stop()

	s0 := r.snapshot(ctx, ch.pid)
	goAt := time.Now()
	if err := ch.start(); err != nil {
		return fail(err)
	}
	timedOut, err := r.awaitApplied(ctx, projectionTable(schema), int64(n), ch)
	seen := time.Since(goAt)
	s1 := r.snapshot(ctx, ch.pid)
	res.RelayPeakRSS = peakRSS(ch.pid)
	if err2 := ch.exitedEarly(); err2 != nil {
		res.Error = "consumer exited during the phase: " + err2.Error()
	}
	ch.stop()
	if err != nil {
		return fail(fmt.Errorf("await: %w", err))
	}
	cpu := cpuDelta(s0, s1)
	res.CPU = &cpu
	res.Committed = int64(n)
	res.TimedOut = timedOut

	// The checks, on the projection as the stopped consumer left it and
	// on what the child saw committed.
	var st consumeStats
	if b, err := os.ReadFile(stats); err != nil {
		res.Note += "; no apply log from the consumer: " + err.Error()
	} else if err := json.Unmarshal(b, &st); err != nil {
		res.Note += "; bad apply log: " + err.Error()
	}
	_ = os.Remove(stats)
	k, err := r.checkProjection(ctx, schema, n, keys, &st)
	if err != nil {
		return fail(fmt.Errorf("check: %w", err))
	}
	res.Applied = k.sum
	res.Delivered = k.distinct
	res.Duplicates = k.duplicates
	res.Inversions = k.inversions
	if timedOut {
		res.Undelivered = int64(n) - k.distinct
	} else {
		res.Missing = k.missing
	}
	if k.note != "" {
		res.Note += "; " + k.note
	}
	res.ApplyTx = st.Tx
	if st.Txs > 0 {
		res.EventsPerTx = float64(st.Events) / float64(st.Txs)
	}
	res.Seconds = seen.Seconds()
	if st.FirstBegin > 0 {
		res.FirstDelivery = float64(st.FirstBegin-goAt.UnixNano()) / 1e9
	}
	if st.LastCommit > 0 {
		res.DrainSeconds = float64(st.LastCommit-goAt.UnixNano()) / 1e9
	} else {
		res.DrainSeconds = seen.Seconds()
	}
	if res.DrainSeconds > 0 {
		res.DrainRate = float64(res.Delivered) / res.DrainSeconds
	}
	res.setPer10k(res.Delivered)
	return res
}

// awaitApplied polls the projection's sum(orders) until it reaches n,
// applying stalls for the grace period (10 s at least before the first
// apply, for the consumer's start), the child exits, or the drain wait
// ends (timed out).
func (r *runner) awaitApplied(ctx context.Context, table string, n int64, ch *child) (timedOut bool, err error) {
	deadline := time.Now().Add(r.p.DrainMaxWait)
	var sum, last int64
	progress := time.Now()
	for ctx.Err() == nil {
		if err := r.env.pool.QueryRow(ctx, `SELECT COALESCE(sum(orders), 0) FROM `+table).Scan(&sum); err != nil {
			return false, err
		}
		if sum >= n {
			return false, nil
		}
		if sum != last {
			last, progress = sum, time.Now()
		}
		grace := r.p.Grace
		if sum == 0 {
			grace = max(grace, 10*time.Second)
		}
		if time.Since(progress) > grace || ch.exitedEarly() != nil {
			return false, nil
		}
		if time.Now().After(deadline) {
			return true, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false, ctx.Err()
}

type projectionCheck struct {
	sum, distinct, missing, duplicates, inversions int64
	note                                           string
}

// checkProjection compares the projection with the backlog (key k had
// n/keys events, one more for the first n%keys keys) and reads the apply
// log: per key, the seqs in commit order (by position). An inversion is
// an event applied after an event of its key with a higher seq; a
// duplicate a seq applied again. The projection's counts and the log must
// agree; where they do not, the larger figure is reported and the
// disagreement noted.
func (r *runner) checkProjection(ctx context.Context, schema string, n, keys int, st *consumeStats) (projectionCheck, error) {
	var k projectionCheck
	rows, err := r.env.pool.Query(ctx, `SELECT customer, orders FROM `+projectionTable(schema))
	if err != nil {
		return k, err
	}
	orders := map[string]int64{}
	for rows.Next() {
		var c string
		var o int64
		if err := rows.Scan(&c, &o); err != nil {
			rows.Close()
			return k, err
		}
		orders[c] = o
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return k, err
	}
	var dbOver, dbUnder, logDup, logMissing, logDistinct int64
	want := make(map[string]int64, keys)
	for key := 1; key <= keys; key++ {
		want[KeyString(key)] = int64(n / keys)
		if key-1 < n%keys {
			want[KeyString(key)]++
		}
	}
	for c, got := range orders {
		k.sum += got
		if _, ok := want[c]; !ok {
			dbOver += got // a row for no key of the backlog
		}
	}
	for c, w := range want {
		got := orders[c]
		dbOver += max(0, got-w)
		dbUnder += max(0, w-got)

		as := st.Applied[c]
		slices.SortStableFunc(as, func(a, b applied) int { return cmp.Compare(a.Pos, b.Pos) })
		seen := make(map[int64]bool, len(as))
		var top int64
		for _, a := range as {
			if seen[a.Seq] {
				logDup++
			}
			seen[a.Seq] = true
			if a.Seq < top {
				k.inversions++
			} else {
				top = a.Seq
			}
		}
		for s := int64(1); s <= w; s++ {
			if !seen[s] {
				logMissing++
			}
		}
		logDistinct += int64(len(seen))
	}
	k.duplicates = max(dbOver, logDup)
	k.missing = max(dbUnder, logMissing)
	k.distinct = logDistinct
	if st.Applied == nil {
		k.distinct = k.sum - dbOver
	}
	var notes []string
	if st.Applied != nil && st.Events != k.sum {
		notes = append(notes, fmt.Sprintf("apply log has %d committed applies, projection sum(orders) %d", st.Events, k.sum))
	}
	if st.Outside > 0 {
		notes = append(notes, fmt.Sprintf("%d applies outside a transaction", st.Outside))
	}
	k.note = strings.Join(notes, "; ")
	return k, nil
}
