package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
)

// One phase of a scenario: a load (open at a rate, or closed as fast as
// producers go) against one contender, measured and judged.

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
	n := r.phaseEvents(s)
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
		note, err := r.preload(ctx, s, tr, n, nonce)
		if err != nil {
			return fail(err)
		}
		res.Note = note
	}

	var ch *child
	if relay {
		args, err := r.relayArgs(s, stream, prefix, n, nonce)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(r.relayLog, "=== %s %s %s %s repeat %d\n", time.Now().Format(time.RFC3339), s.name, s.scenario, s.param, r.rep)
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

	res.CPU = new(cpuDelta(s0, s1))
	r.figures(&res, s, tr, relay, timedOut, phaseTimes{goAt, loadStart, loadEnd}, samples)

	return res
}

// phaseTimes are a phase's moments on its tracker's clock: when the relay
// was let go, and when the load started and ended.
type phaseTimes struct{ goAt, loadStart, loadEnd int64 }

// figures fills res from what the phase's tracker saw.
func (r *runner) figures(res *Result, s phaseSpec, tr *tracker, relay, timedOut bool, t phaseTimes, samples []sample) {
	res.Seconds = float64(t.loadEnd-t.loadStart) / 1e9
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
			if last := tr.lastRecv.Load(); last > t.loadStart {
				res.DeliveredRate = float64(res.Delivered) / (float64(last-t.loadStart) / 1e9)
			}
		}
	case loadOpen:
		r.judge(res, tr, s.rate, t.loadStart, samples)
	case loadDrain, loadPublish:
		if f := tr.firstRecv.Load(); f > 0 {
			res.FirstDelivery = float64(f-t.goAt) / 1e9
		}
		if l := tr.lastRecv.Load(); l > 0 {
			res.DrainSeconds = float64(l-t.goAt) / 1e9
			res.DrainRate = float64(res.Delivered) / res.DrainSeconds
		}
	}
}

// phaseEvents is how many events a phase may produce (its tracker's size).
func (r *runner) phaseEvents(s phaseSpec) int {
	switch s.load {
	case loadOpen:
		return int(float64(s.rate)*(r.p.Warmup+r.p.Steady).Seconds()) + 1
	case loadClosed:
		return r.p.MaxEvents
	}
	return s.events
}

// preload writes a drain phase's backlog of n events before the relay
// starts, and says how long it took.
func (r *runner) preload(ctx context.Context, s phaseSpec, tr *tracker, n int, nonce uint64) (note string, err error) {
	metas := make([]Meta, n)
	for g := range metas {
		metas[g] = Meta{G: int64(g), Key: g%r.o.Keys + 1, Seq: int64(g/r.o.Keys + 1)}
	}
	t := time.Now()
	if err := s.c.Preload(ctx, r.env, nonce, metas); err != nil {
		return "", fmt.Errorf("preload: %w", err)
	}
	note = fmt.Sprintf("preload %.1f s", time.Since(t).Seconds())
	for g := range n {
		tr.commit(int64(g))
	}
	if err := s.c.Analyze(ctx, r.env); err != nil {
		return "", fmt.Errorf("analyze: %w", err)
	}
	return note, nil
}

// relayArgs are the relay child's arguments for a phase.
func (r *runner) relayArgs(s phaseSpec, stream, prefix string, n int, nonce uint64) ([]string, error) {
	args := []string{"--impl", s.impl, "--stream", stream, "--prefix", prefix}
	if s.c != nil {
		args = append(args, s.c.RelayArgs(r.env)...)
	}
	if r.o.CPUProfiles {
		dir := filepath.Join(r.o.Out, "pprof")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		name := strings.NewReplacer("/", "_", " ", "_", "=", "").Replace(fmt.Sprintf("%s-%s-%s-r%d.pprof", s.name, s.scenario, s.param, r.rep))
		args = append(args, "--cpuprofile", filepath.Join(dir, name))
	}
	if s.load == loadPublish {
		args = append(args, "--count", strconv.Itoa(n), "--nonce", strconv.FormatUint(nonce, 10), "--keys", strconv.Itoa(r.o.Keys))
	}
	return args, nil
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
