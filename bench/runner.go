package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Report is the outcome of a run.
type Report struct {
	Options  Options      `json:"-"`
	Profile  *Profile     `json:"profile"`
	Machine  *MachineInfo `json:"machine"`
	Results  []Result     `json:"results"`
	Started  time.Time    `json:"started"`
	Elapsed  float64      `json:"elapsed_s"`
	Order    [][]string   `json:"order"` // contender order per repeat
	Describe map[string]string
	Ordered  map[string]bool
}

type runner struct {
	o        Options
	p        *Profile
	env      *env
	nc       *nats.Conn
	js       jetstream.JetStream
	report   *Report
	jsonl    *os.File
	relayLog *os.File
	phaseN   int
	rep      int
}

// Run runs the benchmark and writes results.jsonl, summary.md and
// chart.png into o.Out.
func Run(ctx context.Context, opts *Options) (*Report, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	r := &runner{o: o, p: o.Profile, report: &Report{Options: o, Profile: o.Profile, Started: time.Now(), Describe: map[string]string{}, Ordered: map[string]bool{}}}
	if r.jsonl, err = os.Create(filepath.Join(o.Out, "results.jsonl")); err != nil {
		return nil, err
	}
	defer r.jsonl.Close()
	if r.relayLog, err = os.Create(filepath.Join(o.Out, "relay.log")); err != nil {
		return nil, err
	}
	defer r.relayLog.Close()

	if err := r.connect(ctx); err != nil {
		return nil, err
	}
	defer r.close()
	r.report.Machine = collectMachineInfo(ctx, r.env.pool, r.nc, &o)

	contenders := make(map[string]contender)
	var relayNames []string
	if o.hasRelay() {
		relayNames = o.Contenders
	}
	for _, name := range relayNames {
		c, err := newContender(name, o.SchemaPrefix)
		if err != nil {
			return nil, err
		}
		contenders[name] = c
		r.report.Describe[name] = c.Describe()
		r.report.Ordered[name] = c.OrderedPerKey()
	}
	consumers := make(map[string]consumer)
	var consumerNames []string
	if o.has("consume") && o.Profile.ConsumeEvents > 0 {
		consumerNames = o.Consumers
	}
	for _, name := range consumerNames {
		c, err := newConsumer(name, o.SchemaPrefix)
		if err != nil {
			return nil, err
		}
		consumers[name] = c
		r.report.Describe[name] = c.Describe()
		r.report.Ordered[name] = c.OrderedPerKey()
	}
	set := map[string]bool{}
	defer func() {
		if o.Keep {
			return
		}
		for name := range set {
			if c, ok := consumers[name]; ok {
				_, _ = r.env.pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+c.schema()+` CASCADE`)
				continue
			}
			_ = contenders[name].Teardown(context.WithoutCancel(ctx), r.env)
		}
	}()

	for rep := 1; rep <= o.Repeat; rep++ {
		r.rep = rep
		order := append([]string(nil), relayNames...)
		corder := append([]string(nil), consumerNames...)
		if rep > 1 {
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			rand.Shuffle(len(corder), func(i, j int) { corder[i], corder[j] = corder[j], corder[i] })
		}
		r.report.Order = append(r.report.Order, append(append([]string(nil), order...), corder...))
		if o.has("ceiling") {
			for _, impl := range []string{"publish-async", "publish-sync"} {
				r.add(r.runPhase(ctx, phaseSpec{name: "jetstream", impl: impl, scenario: "ceiling", param: impl, load: loadPublish, events: r.p.PublishCount}))
			}
		}
		for _, name := range order {
			if ctx.Err() != nil {
				return r.finish()
			}
			c := contenders[name]
			if !set[name] {
				r.logf("setup %s", name)
				if err := c.Setup(ctx, r.env); err != nil {
					r.add(Result{Contender: name, Scenario: "setup", Repeat: rep, Error: err.Error()})
					continue
				}
				set[name] = true
			}
			r.runContender(ctx, c)
		}
		// Consumers, one at a time, after the relays.
		for _, name := range corder {
			if ctx.Err() != nil {
				return r.finish()
			}
			c := consumers[name]
			if !set[name] {
				r.logf("setup %s", name)
				if err := c.Setup(ctx, r.env); err != nil {
					r.add(Result{Contender: name, Scenario: "consume", Param: "setup", Repeat: rep, Error: err.Error()})
					continue
				}
				set[name] = true
			}
			r.add(r.runConsume(ctx, c))
		}
	}
	return r.finish()
}

func (r *runner) finish() (*Report, error) {
	r.report.Elapsed = time.Since(r.report.Started).Seconds()
	if err := writeSummary(r.report, r.o.Out); err != nil {
		return r.report, err
	}
	if err := writeChart(r.report, filepath.Join(r.o.Out, "chart.png")); err != nil {
		return r.report, fmt.Errorf("chart: %w", err)
	}
	return r.report, nil
}

func (r *runner) runContender(ctx context.Context, c contender) {
	name := c.Name()
	if r.o.has("ceiling") {
		for _, async := range []bool{false, true} {
			param := "sync-on"
			if async {
				param = "sync-off"
			}
			r.add(r.runPhase(ctx, phaseSpec{c: c, name: name, scenario: "ceiling", param: param, load: loadClosed, async: async, duration: r.p.CeilingDuration}))
		}
	}
	if r.o.has("produce") {
		r.add(r.runPhase(ctx, phaseSpec{c: c, name: name, impl: name, scenario: "produce", param: "sync-on", load: loadClosed, duration: r.p.ProduceDuration}))
	}
	steps := map[int]Result{}
	sustained := 0
	if r.o.has("ladder") {
		step := func(rate int) bool {
			res := r.runPhase(ctx, phaseSpec{c: c, name: name, impl: name, scenario: "ladder", param: "rate=" + strconv.Itoa(rate), load: loadOpen, rate: rate})
			r.add(res)
			steps[rate] = res
			return res.Pass != nil && *res.Pass
		}
		for i, rate := range r.p.Ladder {
			if step(rate) {
				sustained = rate
				continue
			}
			if i == 0 && r.p.LadderDown {
				// Below the first rung: find a rate it does sustain.
				for _, down := range []int{rate / 2, rate / 4, rate / 10} {
					if down > 0 && step(down) {
						sustained = down
						break
					}
				}
			}
			break
		}
		r.add(Result{Contender: name, Scenario: "sustained", Param: "max", Repeat: r.rep, Rate: sustained, Note: "highest ladder rate meeting delivered ≥ 99%, backlog slope < 1%/s, p99 (intended→receive) < 1 s"})
	}
	if r.o.has("latency") {
		for _, rate := range r.p.FixedRates {
			if res, ok := steps[rate]; ok {
				res.Scenario, res.Note = "latency", "same run as the ladder step"
				r.add(res)
				continue
			}
			r.add(r.runPhase(ctx, phaseSpec{c: c, name: name, impl: name, scenario: "latency", param: "rate=" + strconv.Itoa(rate), load: loadOpen, rate: rate}))
		}
		if r.p.HalfMax && sustained > 0 {
			rate := max(100, sustained/2/100*100)
			r.add(r.runPhase(ctx, phaseSpec{c: c, name: name, impl: name, scenario: "latency", param: "half-max", load: loadOpen, rate: rate}))
		}
	}
	if r.o.has("drain") {
		for _, n := range r.p.Drains {
			r.add(r.runPhase(ctx, phaseSpec{c: c, name: name, impl: name, scenario: "drain", param: "backlog=" + strconv.Itoa(n), load: loadDrain, events: n}))
		}
	}
}

func (r *runner) add(res Result) {
	if res.Repeat == 0 {
		res.Repeat = r.rep
	}
	r.report.Results = append(r.report.Results, res)
	b, _ := json.Marshal(res)
	_, _ = r.jsonl.Write(append(b, '\n'))
	r.logf("%s", oneLine(&res))
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.o.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (r *runner) connect(ctx context.Context) error {
	pc, err := pgxpool.ParseConfig(r.o.DatabaseURL)
	if err != nil {
		return fmt.Errorf("--database-url: %w", err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "ferrybench-driver"
	pc.MaxConns = int32(r.o.Producers + 4)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return fmt.Errorf("cannot reach PostgreSQL at --database-url (%s): %w", r.o.DatabaseURL, err)
	}
	apc := pc.Copy()
	apc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	async, err := pgxpool.NewWithConfig(ctx, apc)
	if err != nil {
		pool.Close()
		return err
	}
	tmp, err := os.MkdirTemp("", "ferry-bench-")
	if err != nil {
		return err
	}
	r.env = &env{pool: pool, asyncPool: async, dbURL: r.o.DatabaseURL, keys: r.o.Keys, tmpDir: tmp, log: r.o.Log}
	if r.nc, err = nats.Connect(r.o.NATSURL, nats.Name("ferrybench-driver")); err != nil {
		return fmt.Errorf("cannot reach NATS at --nats-url (%s): %w", r.o.NATSURL, err)
	}
	r.js, err = jetstream.New(r.nc)
	return err
}

func (r *runner) close() {
	if r.nc != nil {
		r.nc.Close()
	}
	if r.env != nil {
		r.env.pool.Close()
		r.env.asyncPool.Close()
		_ = os.RemoveAll(r.env.tmpDir)
	}
}

type loadKind int

const (
	loadClosed  loadKind = iota // producers as fast as they can
	loadOpen                    // producers on a fixed schedule
	loadDrain                   // preloaded backlog, then the relay
	loadPublish                 // the child publishes pre-built events
)

type phaseSpec struct {
	c        contender // nil for the publish-only ceiling
	name     string
	impl     string // relay implementation; "" for no relay
	scenario string
	param    string
	load     loadKind
	async    bool
	rate     int
	duration time.Duration
	events   int
}

type sample struct {
	at      int64 // ns since the tracker's base
	backlog int64 // offered so far − received
}

// runPhase runs one measured phase from a clean state.
func (r *runner) runPhase(ctx context.Context, s phaseSpec) (res Result) {
	res = Result{Contender: s.name, Scenario: s.scenario, Param: s.param, Repeat: r.rep, Rate: s.rate, Events: s.events}
	if ctx.Err() != nil {
		res.Error = ctx.Err().Error()
		return res
	}
	r.logf("run %s %s %s (repeat %d)", s.name, s.scenario, s.param, r.rep)
	fail := func(err error) Result {
		res.Error = err.Error()
		return res
	}
	if s.c != nil {
		if err := s.c.Reset(ctx, r.env, r.p.Checkpoint); err != nil {
			return fail(fmt.Errorf("reset: %w", err))
		}
	}
	nonce := rand.Uint64()
	var n int
	switch s.load {
	case loadOpen:
		n = int(float64(s.rate)*(r.p.Warmup+r.p.Steady).Seconds()) + 1
	case loadClosed:
		n = r.p.MaxEvents
	default:
		n = s.events
	}
	tr := newTracker(n, r.o.Keys)

	relay := s.impl != ""
	var stream, prefix string
	stopConsumer := func() {}
	if relay {
		r.phaseN++
		stream = fmt.Sprintf("FERRYBENCH_%d_%d", os.Getpid(), r.phaseN)
		prefix = fmt.Sprintf("ferrybench.%d.%d", os.Getpid(), r.phaseN)
		sink, err := ferrynats.New(ctx, r.nc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
		if err != nil {
			return fail(fmt.Errorf("create stream: %w", err))
		}
		_ = sink.Close(ctx)
		defer func() { _ = r.js.DeleteStream(context.WithoutCancel(ctx), stream) }()
		var err2 error
		if stopConsumer, err2 = r.consume(ctx, stream, tr); err2 != nil {
			return fail(fmt.Errorf("consumer: %w", err2))
		}
		defer stopConsumer()
	}

	if s.load == loadDrain {
		metas := make([]Meta, n)
		for g := range metas {
			metas[g] = Meta{G: int64(g), Key: g%r.o.Keys + 1, Seq: int64(g/r.o.Keys + 1)}
		}
		t := time.Now()
		if err := s.c.Preload(ctx, r.env, nonce, metas); err != nil {
			return fail(fmt.Errorf("preload: %w", err))
		}
		res.Note = fmt.Sprintf("preload %.1f s", time.Since(t).Seconds())
		for g := range n {
			tr.commit(int64(g))
		}
		if err := s.c.Analyze(ctx, r.env); err != nil {
			return fail(fmt.Errorf("analyze: %w", err))
		}
	}

	var ch *child
	if relay {
		args := []string{"--impl", s.impl, "--stream", stream, "--prefix", prefix}
		if s.c != nil {
			args = append(args, s.c.RelayArgs(r.env)...)
		}
		if r.o.CPUProfiles {
			dir := filepath.Join(r.o.Out, "pprof")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fail(err)
			}
			name := strings.NewReplacer("/", "_", " ", "_", "=", "").Replace(fmt.Sprintf("%s-%s-%s-r%d.pprof", s.name, s.scenario, s.param, r.rep))
			args = append(args, "--cpuprofile", filepath.Join(dir, name))
		}
		if s.load == loadPublish {
			args = append(args, "--count", strconv.Itoa(n), "--nonce", strconv.FormatUint(nonce, 10), "--keys", strconv.Itoa(r.o.Keys))
		}
		fmt.Fprintf(r.relayLog, "=== %s %s %s %s repeat %d\n", time.Now().Format(time.RFC3339), s.name, s.scenario, s.param, r.rep)
		var err error
		if ch, err = r.startChild(args); err != nil {
			return fail(err)
		}
		defer ch.stop()
	}
	var prod producer
	if s.load == loadOpen || s.load == loadClosed {
		var err error
		if prod, err = s.c.Producer(ctx, r.env, s.async); err != nil {
			return fail(fmt.Errorf("producer: %w", err))
		}
		defer prod.Close()
		if s.async {
			// Close the synchronous_commit=off connections after the phase.
			defer r.env.asyncPool.Reset()
		}
	}

	pid := 0
	if ch != nil {
		pid = ch.pid
	}
	s0 := r.snapshot(ctx, pid)
	if ch != nil {
		if err := ch.start(); err != nil {
			return fail(err)
		}
	}
	goAt := tr.now()
	if s.load == loadPublish {
		for g := range n {
			tr.commit(int64(g))
		}
	}

	var loadStart, loadEnd int64
	var samples []sample
	switch s.load {
	case loadOpen:
		loadStart, samples = r.runOpen(ctx, prod, tr, s.rate, nonce)
	case loadClosed:
		loadStart = tr.now()
		r.runClosed(ctx, prod, tr, s.duration, nonce)
	default:
		loadStart = goAt
	}
	loadEnd = tr.now()

	timedOut := false
	if relay {
		wait := r.p.MaxWait
		if s.load == loadDrain || s.load == loadPublish {
			wait = r.p.DrainMaxWait
		}
		timedOut = r.awaitDelivery(ctx, tr, ch, wait)
	}
	s1 := r.snapshot(ctx, pid)
	if ch != nil {
		res.RelayPeakRSS = peakRSS(ch.pid)
		if err := ch.exitedEarly(); err != nil {
			res.Error = "relay exited during the phase: " + err.Error()
		}
		ch.stop()
	}
	stopConsumer()

	// Figures.
	cpu := cpuDelta(s0, s1)
	res.CPU = &cpu
	res.Seconds = float64(loadEnd-loadStart) / 1e9
	res.Committed = tr.nCommitted.Load()
	res.Delivered = tr.nReceived.Load()
	res.ProducerErrors = tr.prodErrors.Load()
	res.Duplicates, res.Inversions, res.Foreign = tr.counts()
	if timedOut {
		res.TimedOut = true
		res.Undelivered = res.Committed - res.Delivered
	} else if relay {
		res.Missing = tr.missing()
	}
	if relay {
		res.setPer10k(res.Delivered)
	} else {
		res.setPer10k(res.Committed)
	}
	switch s.load {
	case loadClosed:
		if res.Seconds > 0 {
			res.ProducerTPS = float64(res.Committed) / res.Seconds
		}
		res.ProducerTx = tr.txDurations(0, 0)
		if relay {
			res.CommitLatency, _, res.StoredLatency = tr.latencies(0, 0)
			if last := tr.lastRecv.Load(); last > loadStart {
				res.DeliveredRate = float64(res.Delivered) / (float64(last-loadStart) / 1e9)
			}
		}
	case loadOpen:
		r.judge(&res, tr, s.rate, loadStart, samples)
	case loadDrain, loadPublish:
		if f := tr.firstRecv.Load(); f > 0 {
			res.FirstDelivery = float64(f-goAt) / 1e9
		}
		if l := tr.lastRecv.Load(); l > 0 {
			res.DrainSeconds = float64(l-goAt) / 1e9
			res.DrainRate = float64(res.Delivered) / res.DrainSeconds
		}
	}
	return res
}

// snapshot reads the CPU counters; the bench's own PostgreSQL processes
// are its connections (application_name ferrybench-…) and the cluster's
// background processes.
func (r *runner) snapshot(ctx context.Context, relayPID int) cpuSnapshot {
	var pids []int
	rows, err := r.env.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'ferrybench%' OR backend_type <> 'client backend'`)
	if err == nil {
		pids, _ = pgx.CollectRows(rows, func(row pgx.CollectableRow) (int, error) {
			var pid int32
			err := row.Scan(&pid)
			return int(pid), err
		})
	}
	return takeSnapshot(relayPID, pids)
}

// judge evaluates a fixed-rate step over its steady window.
func (r *runner) judge(res *Result, tr *tracker, rate int, loadStart int64, samples []sample) {
	from := loadStart + int64(r.p.Warmup)
	to := from + int64(r.p.Steady)
	steady := r.p.Steady.Seconds()
	res.Offered = int64(float64(rate) * steady)
	if res.Seconds > 0 {
		res.ProducerTPS = float64(res.Committed) / res.Seconds
	}
	delivered := tr.receivedBetween(from, to)
	res.DeliveredRate = float64(delivered) / steady
	if res.Offered > 0 {
		res.DeliveredRatio = float64(delivered) / float64(res.Offered)
	}
	var xs, ys []float64
	for _, s := range samples {
		if s.at >= from && s.at < to {
			xs = append(xs, float64(s.at)/1e9)
			ys = append(ys, float64(s.backlog))
		}
	}
	res.BacklogSlope = slope(xs, ys)
	res.SlopeRatio = res.BacklogSlope / float64(rate)
	res.CommitLatency, res.IntentLatency, res.StoredLatency = tr.latencies(from, to)
	res.ProducerTx = tr.txDurations(from, to)
	pass := true
	var why []string
	if res.DeliveredRatio < 0.99 {
		pass = false
		why = append(why, fmt.Sprintf("delivered %.1f%%", res.DeliveredRatio*100))
	}
	if res.SlopeRatio >= 0.01 {
		pass = false
		why = append(why, fmt.Sprintf("backlog slope %.1f%%/s", res.SlopeRatio*100))
	}
	if res.IntentLatency == nil || res.IntentLatency.P99 >= 1000 {
		pass = false
		if res.IntentLatency != nil {
			why = append(why, "p99 "+ms(res.IntentLatency.P99)+" ms")
		}
	}
	res.Pass = &pass
	for i, w := range why {
		if i > 0 {
			res.Why += ", "
		}
		res.Why += w
	}
}

// slope is the least-squares slope of ys over xs.
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// runOpen produces tr.n events on a fixed schedule (open loop) and returns
// the schedule's start and backlog samples. A producer that is late sends at
// once; latency from the intended time then includes its lateness, so
// stalls are not hidden (no coordinated omission). Producing stops at the
// end of the steady window even if the schedule is not done.
func (r *runner) runOpen(ctx context.Context, prod producer, tr *tracker, rate int, nonce uint64) (int64, []sample) {
	interval := float64(time.Second) / float64(rate)
	start := tr.now() + int64(20*time.Millisecond)
	for g := range tr.n {
		tr.intended[g] = start + int64(float64(g)*interval)
	}
	end := start + int64(r.p.Warmup+r.p.Steady)
	var samples []sample
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				now := tr.now()
				offered := min(int64(tr.n), max(0, int64(float64(now-start)/interval)+1))
				samples = append(samples, sample{at: now, backlog: offered - tr.nReceived.Load()})
			}
		}
	}()
	var next atomic.Int64
	var wg sync.WaitGroup
	var logged atomic.Bool
	for range r.o.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				g := next.Add(1) - 1
				if g >= int64(tr.n) {
					return
				}
				it := tr.intended[g]
				if wait := time.Duration(it - tr.now()); wait > 0 {
					time.Sleep(wait)
				}
				now := tr.now()
				if now >= end {
					return
				}
				tr.started[g] = now
				if err := prod.Produce(ctx, nonce, g, rand.IntN(r.o.Keys)+1, it); err != nil {
					tr.prodErrors.Add(1)
					if logged.CompareAndSwap(false, true) {
						r.logf("producer error: %v", err)
					}
					continue
				}
				tr.commit(g)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	return start, samples
}

// runClosed runs producers back to back for d.
func (r *runner) runClosed(ctx context.Context, prod producer, tr *tracker, d time.Duration, nonce uint64) {
	deadline := time.Now().Add(d)
	var next atomic.Int64
	var wg sync.WaitGroup
	var logged atomic.Bool
	for range r.o.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(deadline) {
				g := next.Add(1) - 1
				if g >= int64(tr.n) {
					return
				}
				tr.started[g] = tr.now()
				if err := prod.Produce(ctx, nonce, g, rand.IntN(r.o.Keys)+1, 0); err != nil {
					tr.prodErrors.Add(1)
					if logged.CompareAndSwap(false, true) {
						r.logf("producer error: %v", err)
					}
					continue
				}
				tr.commit(g)
			}
		}()
	}
	wg.Wait()
}

// awaitDelivery waits until every committed event was received, or
// delivery stalled for the grace period (what is left is missing), or
// maxWait passed while delivery still progressed (timed out).
func (r *runner) awaitDelivery(ctx context.Context, tr *tracker, ch *child, maxWait time.Duration) (timedOut bool) {
	deadline := time.Now().Add(maxWait)
	last := tr.nReceived.Load()
	progress := time.Now()
	for ctx.Err() == nil {
		got := tr.nReceived.Load()
		if got >= tr.nCommitted.Load() {
			return false
		}
		if got != last {
			last, progress = got, time.Now()
		}
		if time.Since(progress) > r.p.Grace || (ch != nil && ch.exitedEarly() != nil) {
			return false
		}
		if time.Now().After(deadline) {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// consume starts the bench's own JetStream consumer on stream: an ordered
// consumer, so messages arrive in stream order and per-key order is checked
// on what the stream stored.
func (r *runner) consume(ctx context.Context, stream string, tr *tracker) (func(), error) {
	cons, err := r.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var stored time.Time
		if md, err := m.Metadata(); err == nil {
			stored = md.Timestamp
		}
		tr.receive(m.Data(), stored)
	}, jetstream.PullMaxMessages(4096))
	if err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(cc.Stop) }, nil
}

// child is the relay process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	pid    int
	done   chan struct{}
	err    error
	mu     sync.Mutex
	closed bool
}

func (r *runner) startChild(args []string) (*child, error) {
	full := append([]string{"relay", "--database-url", r.o.DatabaseURL, "--nats-url", r.o.NATSURL}, args...)
	cmd := r.o.RelayCommand(full)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = pw
	cmd.Stderr = r.relayLog
	if err := cmd.Start(); err != nil {
		_ = pr.Close()
		_ = pw.Close()
		return nil, fmt.Errorf("start relay child: %w", err)
	}
	_ = pw.Close()
	c := &child{cmd: cmd, stdin: stdin, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		if c.err == nil {
			c.err = errors.New("exited")
		}
		close(c.done)
	}()
	if err := waitReady(bufio.NewReader(pr), 2*time.Minute); err != nil {
		c.kill()
		_ = pr.Close()
		return nil, fmt.Errorf("%w (see relay.log)", err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr); _ = pr.Close() }()
	return c, nil
}

func (c *child) start() error {
	_, err := io.WriteString(c.stdin, "go\n")
	return err
}

// exitedEarly returns the child's exit error if it has exited.
func (c *child) exitedEarly() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// stop closes the child's stdin (its signal to stop gracefully) and waits,
// killing it after 20 s.
func (c *child) stop() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	_ = c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		c.kill()
	}
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

func oneLine(r *Result) string {
	s := fmt.Sprintf("%s %s %s:", r.Contender, r.Scenario, r.Param)
	if r.Error != "" {
		return s + " ERROR " + r.Error
	}
	if r.ProducerTPS > 0 {
		s += fmt.Sprintf(" producer %.0f tx/s", r.ProducerTPS)
	}
	if r.DrainRate > 0 {
		what := "drain"
		if r.Scenario == "consume" {
			what = "apply"
		}
		s += fmt.Sprintf(" %s %.0f ev/s in %.2f s", what, r.DrainRate, r.DrainSeconds)
	}
	if r.Pass != nil {
		s += fmt.Sprintf(" delivered %.1f%% slope %.2f%%/s pass=%v %s", r.DeliveredRatio*100, r.SlopeRatio*100, *r.Pass, r.Why)
	}
	if l := r.CommitLatency; l != nil {
		s += fmt.Sprintf(" commit→recv p50 %s p99 %s max %s ms", ms(l.P50), ms(l.P99), ms(l.Max))
	}
	if l := r.StoredLatency; l != nil {
		s += fmt.Sprintf(" commit→stored p50 %s p99 %s ms", ms(l.P50), ms(l.P99))
	}
	if l := r.IntentLatency; l != nil {
		s += fmt.Sprintf(" intended→recv p99 %s ms", ms(l.P99))
	}
	if l := r.ProducerTx; l != nil {
		s += fmt.Sprintf(" tx p50 %.1f p99 %.1f ms", l.P50, l.P99)
	}
	if l := r.ApplyTx; l != nil {
		s += fmt.Sprintf(" apply tx p50 %s p99 %s ms (%.1f events/tx)", ms(l.P50), ms(l.P99), r.EventsPerTx)
	}
	if r.CPUPer10k != nil && r.Delivered > 0 {
		s += fmt.Sprintf(" cpu/10k relay %.2f pg %.2f s", r.CPUPer10k.Relay, r.CPUPer10k.Postgres)
	}
	if r.Scenario == "sustained" {
		s += fmt.Sprintf(" %d ev/s", r.Rate)
	}
	if r.Scenario == "consume" {
		s += fmt.Sprintf(" applied %d (sum(orders) %d of %d) missing %d dup %d inv %d", r.Delivered, r.Applied, r.Events, r.Missing, r.Duplicates, r.Inversions)
	} else if r.Delivered > 0 || r.Missing > 0 {
		s += fmt.Sprintf(" delivered %d missing %d dup %d inv %d", r.Delivered, r.Missing, r.Duplicates, r.Inversions)
	}
	if r.TimedOut {
		s += fmt.Sprintf(" TIMED OUT (%d undelivered)", r.Undelivered)
	}
	return s
}
