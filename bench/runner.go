package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

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
