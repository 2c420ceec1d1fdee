package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// view answers questions over a report's results, taking the median over
// repeats.
type view struct{ r *Report }

func (v view) find(contender, scenario, param string) []Result {
	var out []Result
	for _, res := range v.r.Results {
		if res.Contender == contender && res.Scenario == scenario && (param == "" || res.Param == param) && res.Error == "" {
			out = append(out, res)
		}
	}
	return out
}

// stat is the median (and range) of a metric over repeats.
type stat struct {
	med, lo, hi float64
	n           int
}

func statOf(rs []Result, f func(Result) (float64, bool)) stat {
	var xs []float64
	for _, r := range rs {
		if x, ok := f(r); ok {
			xs = append(xs, x)
		}
	}
	if len(xs) == 0 {
		return stat{}
	}
	sort.Float64s(xs)
	m := xs[len(xs)/2]
	if len(xs)%2 == 0 {
		m = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return stat{med: m, lo: xs[0], hi: xs[len(xs)-1], n: len(xs)}
}

func (s stat) ok() bool { return s.n > 0 }

// fmtStat formats a stat with format, plus the range when repeats differ.
func fmtStat(s stat, format string) string {
	if !s.ok() {
		return "—"
	}
	out := fmt.Sprintf(format, s.med)
	if s.n > 1 && s.lo != s.hi {
		out += fmt.Sprintf(" ("+format+"–"+format+")", s.lo, s.hi)
	}
	return out
}

func num(x float64) string {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return "—"
	case x >= 100:
		return commas(int64(math.Round(x)))
	case x >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	default:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
}

// ms formats a latency in milliseconds; the value recorded for events
// never received shows as "lost".
func ms(x float64) string {
	if x >= float64(histMax)/1000 {
		return "lost"
	}
	return num(x)
}

func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtNum(s stat) string {
	if !s.ok() {
		return "—"
	}
	out := num(s.med)
	if s.n > 1 && s.lo != s.hi {
		out += " (" + num(s.lo) + "–" + num(s.hi) + ")"
	}
	return out
}

func latPair(rs []Result) string {
	p50 := statOf(rs, func(r Result) (float64, bool) {
		if r.CommitLatency == nil {
			return 0, false
		}
		return r.CommitLatency.P50, true
	})
	p99 := statOf(rs, func(r Result) (float64, bool) {
		if r.CommitLatency == nil {
			return 0, false
		}
		return r.CommitLatency.P99, true
	})
	if !p50.ok() {
		return "—"
	}
	return ms(p50.med) + " / " + ms(p99.med)
}

func mib(b int64) string {
	if b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}

// contenders lists the relay contenders that have results, in run order.
func (v view) contenders() []string {
	var out []string
	for _, res := range v.r.Results {
		if res.Contender != "jetstream" && res.Scenario != "consume" && !slices.Contains(out, res.Contender) {
			out = append(out, res.Contender)
		}
	}
	return out
}

// consumers lists the consume scenario's contenders that have results, in
// run order.
func (v view) consumers() []string {
	var out []string
	for _, res := range v.r.Results {
		if res.Scenario == "consume" && !slices.Contains(out, res.Contender) {
			out = append(out, res.Contender)
		}
	}
	return out
}

// largestDrain returns the results of a contender's largest backlog.
func (v view) largestDrain(c string) ([]Result, int) {
	best := 0
	for _, r := range v.find(c, "drain", "") {
		best = max(best, r.Events)
	}
	if best == 0 {
		return nil, 0
	}
	return v.find(c, "drain", "backlog="+strconv.Itoa(best)), best
}

type correctness struct {
	phases                                         int
	committed, delivered, missing, undelivered     int64
	duplicates, inversions, producerErrors, errors int64
}

func (v view) correctness(c string) correctness {
	var k correctness
	for _, r := range v.r.Results {
		if r.Contender != c || r.Scenario == "sustained" || (r.Scenario == "latency" && strings.HasPrefix(r.Note, "same run")) {
			continue
		}
		if r.Error != "" {
			k.errors++
			continue
		}
		if r.Scenario == "ceiling" && c != "jetstream" {
			continue // no relay
		}
		k.phases++
		k.committed += r.Committed
		k.delivered += r.Delivered
		k.missing += r.Missing
		k.undelivered += r.Undelivered
		k.duplicates += r.Duplicates
		k.inversions += r.Inversions
		k.producerErrors += r.ProducerErrors
	}
	return k
}

func writeSummary(rep *Report, dir string) error {
	v := view{rep}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p := rep.Profile
	w("# Outbox relay benchmark (%s profile)\n\n", p.Name)
	w("Started %s, took %.0f s; %d repeat(s). Each contender ran alone, in its own schema on the same PostgreSQL, publishing through the same JetStream sink (ferrynats: asynchronous publish, window 256, Nats-Msg-Id deduplication). Figures are medians over repeats, with the range in parentheses when repeats differ. Everything shares this machine's cores; read them as this box's figures.\n\n",
		rep.Started.Format("2006-01-02 15:04:05 MST"), rep.Elapsed, len(rep.Order))

	// Overview.
	if len(v.contenders()) > 0 {
		writeOverview(w, v, rep)
	}

	// Ceilings.
	if len(filterScenario(rep.Results, "ceiling")) > 0 {
		writeCeilings(w, v, rep)
	}
	writeRelayTables(w, rep)

	// Consumers.
	if cons := filterScenario(rep.Results, "consume"); len(cons) > 0 {
		writeConsumers(w, rep, cons)
	}

	// Correctness.
	if len(v.contenders()) > 0 || len(v.find("jetstream", "ceiling", "")) > 0 {
		writeCorrectness(w, v, rep)
	}
	var errs []string
	for _, r := range rep.Results {
		if r.Error != "" {
			errs = append(errs, fmt.Sprintf("- %s %s %s (repeat %d): %s", r.Contender, r.Scenario, r.Param, r.Repeat, r.Error))
		}
	}
	if len(errs) > 0 {
		w("\nErrors:\n\n%s\n", strings.Join(errs, "\n"))
	}

	// Configuration.
	w("\n## Contenders\n\n")
	for _, c := range append(v.contenders(), v.consumers()...) {
		w("- **%s**: %s\n", c, rep.Describe[c])
	}
	writeMachine(w, rep)
	return os.WriteFile(filepath.Join(dir, "summary.md"), []byte(b.String()), 0o644)
}

func writeOverview(w func(string, ...any), v view, rep *Report) {
	p := rep.Profile
	w("## Overview\n\n")
	w("| Contender | Sustained events/s | Producer tx/s with relay (%% of no-relay ceiling) | commit→receive p50 / p99 ms @1k/s | @5k/s | @50%% of own max | Drain events/s (backlog) | Relay CPU-s / 10k | PostgreSQL CPU-s / 10k | Relay peak RSS | Missing | Duplicates | Order inversions |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range v.contenders() {
		sus := statOf(v.find(c, "sustained", ""), func(r Result) (float64, bool) { return float64(r.Rate), true })
		prod := statOf(v.find(c, "produce", ""), func(r Result) (float64, bool) { return r.ProducerTPS, r.ProducerTPS > 0 })
		ceil := statOf(v.find(c, "ceiling", "sync-on"), func(r Result) (float64, bool) { return r.ProducerTPS, r.ProducerTPS > 0 })
		prodCell := fmtNum(prod)
		if prod.ok() && ceil.ok() && ceil.med > 0 {
			prodCell += fmt.Sprintf(" (%.0f%%)", 100*prod.med/ceil.med)
		}
		var drains []string
		for _, n := range p.Drains {
			d := statOf(v.find(c, "drain", "backlog="+strconv.Itoa(n)), func(r Result) (float64, bool) { return r.DrainRate, r.DrainRate > 0 && !r.TimedOut })
			if d.ok() {
				drains = append(drains, fmt.Sprintf("%s (%s)", num(d.med), shortN(n)))
			} else if len(v.find(c, "drain", "backlog="+strconv.Itoa(n))) > 0 {
				drains = append(drains, fmt.Sprintf("timeout (%s)", shortN(n)))
			}
		}
		ld, _ := v.largestDrain(c)
		relayCPU := statOf(ld, func(r Result) (float64, bool) { return cpuOf(r, "relay") })
		pgCPU := statOf(ld, func(r Result) (float64, bool) { return cpuOf(r, "postgres") })
		var rss int64
		for _, r := range v.r.Results {
			if r.Contender == c {
				rss = max(rss, r.RelayPeakRSS)
			}
		}
		k := v.correctness(c)
		inv := commas(k.inversions)
		if !rep.Ordered[c] && k.inversions > 0 {
			inv += " (no per-key order promised)"
		}
		missing := commas(k.missing)
		if k.undelivered > 0 {
			missing += fmt.Sprintf(" (+%s undelivered at timeout)", commas(k.undelivered))
		}
		susCell := fmtNum(sus)
		if sus.ok() && sus.med == 0 {
			lowest := p.Ladder[0]
			for _, r := range v.find(c, "ladder", "") {
				lowest = min(lowest, r.Rate)
			}
			susCell = fmt.Sprintf("< %s", commas(int64(lowest)))
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c, susCell, prodCell,
			latPair(v.find(c, "latency", "rate=1000")), latPair(v.find(c, "latency", "rate=5000")), latPair(v.find(c, "latency", "half-max")),
			orDash(strings.Join(drains, ", ")), fmtStat(relayCPU, "%.2f"), fmtStat(pgCPU, "%.2f"), mib(rss), missing, commas(k.duplicates), inv)
	}
	w("\nSustained: the highest ladder rate (%s events/s) at which, over a %s steady window after %s of warm-up, delivered ≥ 99%% of offered, the backlog grew by < 1%% of the rate per second, and p99 from the intended send time to receipt was < 1 s. CPU and RSS columns come from the largest backlog drained. Missing counts committed events never received across all phases with a relay; duplicates are copies the bench's consumer saw twice; inversions are events received after a later event of the same key.\n\n",
		joinInts(p.Ladder), p.Steady, p.Warmup)

}

// writeRelayTables writes the ladder, latency and drain tables.
func writeRelayTables(w func(string, ...any), rep *Report) {
	// Ladder.
	if ladder := filterScenario(rep.Results, "ladder"); len(ladder) > 0 {
		w("\n## Sustained-rate ladder\n\n")
		w("| Contender | Offered/s | Producer tx/s | Delivered/s in window | Delivered %% | Backlog slope %%/s | intended→receive p99 ms | Relay CPU-s / 10k | PostgreSQL CPU-s / 10k | Pass | Why not |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range ladder {
			p99 := "—"
			if r.IntentLatency != nil {
				p99 = ms(r.IntentLatency.P99)
			}
			pass := "—"
			if r.Pass != nil {
				pass = map[bool]string{true: "yes", false: "no"}[*r.Pass]
			}
			w("| %s | %s | %s | %s | %.1f | %.2f | %s | %s | %s | %s | %s |\n", r.Contender, commas(int64(r.Rate)), num(r.ProducerTPS), num(r.DeliveredRate),
				r.DeliveredRatio*100, r.SlopeRatio*100, p99, cpuCell(r, "relay"), cpuCell(r, "postgres"), pass, orDash(r.Why+errSuffix(r)))
		}
	}

	// Latency.
	if lat := filterScenario(rep.Results, "latency"); len(lat) > 0 {
		w("\n## Latency at fixed rates\n\n")
		w("One event per producer transaction, open loop. commit→receive: from the producer's COMMIT returning to the bench's JetStream consumer receiving the message, one clock. commit→stored: from COMMIT returning to JetStream's stored timestamp of the message (the relay's share; same machine's wall clock). intended→receive: from the scheduled send time, so producer stalls count too.\n\n")
		w("| Contender | Rate | commit→receive p50 / p90 / p99 / max ms | commit→stored p50 / p99 ms | intended→receive p50 / p90 / p99 / max ms | Relay CPU-s / 10k | PostgreSQL CPU-s / 10k |\n|---|---|---|---|---|---|---|\n")
		for _, r := range lat {
			label := commas(int64(r.Rate)) + "/s"
			if r.Param == "half-max" {
				label += " (50% of max)"
			}
			stored := "–"
			if l := r.StoredLatency; l != nil {
				stored = fmt.Sprintf("%s / %s", ms(l.P50), ms(l.P99))
			}
			w("| %s | %s | %s | %s | %s | %s | %s |\n", r.Contender, label, latCell(r.CommitLatency), stored, latCell(r.IntentLatency), cpuCell(r, "relay"), cpuCell(r, "postgres"))
		}
	}

	// Drains.
	if drains := filterScenario(rep.Results, "drain"); len(drains) > 0 {
		w("\n## Backlog drains\n\n")
		w("The backlog is written with the relay stopped, through each contender's fast path (Ferry: Emit, 1,000 per transaction; Watermill: 1,000 messages per Publish; River: InsertManyFast, 5,000 per call; naive: COPY), then ANALYZE; the relay process is then started and timed until the bench's consumer has every event.\n\n")
		w("| Contender | Backlog | Preload | First delivery s | Drain s | events/s | Relay CPU-s / 10k | PostgreSQL CPU-s / 10k (bench / whole cluster) | NATS CPU-s / 10k | Relay peak RSS | Missing / dup / inv |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range drains {
			rate := num(r.DrainRate)
			if r.TimedOut {
				rate = fmt.Sprintf("timed out (%s undelivered)", commas(r.Undelivered))
			}
			w("| %s | %s | %s | %.2f | %.2f | %s | %s | %s | %s | %s | %d / %d / %d |\n", r.Contender, commas(int64(r.Events)), orDash(strings.TrimPrefix(r.Note, "preload ")+errSuffix(r)),
				r.FirstDelivery, r.DrainSeconds, rate, cpuCell(r, "relay"), cpuCell(r, "postgres")+" / "+cpuCell(r, "postgres-all"), cpuCell(r, "nats"), mib(r.RelayPeakRSS), r.Missing, r.Duplicates, r.Inversions)
		}
	}

}

func writeCorrectness(w func(string, ...any), v view, rep *Report) {
	w("\n## Correctness (every phase with a relay)\n\n")
	w("| Contender | Promises per-key order | Phases | Committed | Delivered | Missing | Undelivered at timeout | Duplicates | Inversions | Producer errors | Failed phases |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range append(v.contenders(), "jetstream") {
		k := v.correctness(c)
		if k.phases == 0 && k.errors == 0 {
			continue
		}
		promise := "yes"
		if c == "jetstream" {
			promise = "—"
		} else if !rep.Ordered[c] {
			promise = "no"
		}
		w("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %d |\n", c, promise, k.phases, commas(k.committed), commas(k.delivered), commas(k.missing), commas(k.undelivered), commas(k.duplicates), commas(k.inversions), commas(k.producerErrors), k.errors)
	}
}

func writeMachine(w func(string, ...any), rep *Report) {
	p := rep.Profile
	m := rep.Machine
	w("\n## Machine and settings\n\n")
	w("- CPU: %d × %s (GOMAXPROCS %d), memory %s, kernel %s\n", m.CPUs, m.CPUModel, m.GOMAXPROCS, m.Memory, m.Kernel)
	w("- Go %s; PostgreSQL %s; NATS server %s, JetStream %s\n", m.Go, m.PostgreSQL, m.NATS, m.JetStream)
	var settings []string
	for _, k := range pgSettingNames {
		if v, ok := m.PGSettings[k]; ok {
			settings = append(settings, k+"="+v)
		}
	}
	w("- PostgreSQL settings: %s\n", strings.Join(settings, ", "))
	var mods []string
	for k, v := range m.Modules {
		mods = append(mods, k+" "+v)
	}
	sort.Strings(mods)
	w("- Modules: %s\n", strings.Join(mods, "; "))
	w("- Load: %d producer connections, %d keys (accounts, uniform), %d-byte payload, 1 event per transaction\n", m.Producers, m.Keys, m.Payload)
	w("- Profile %s: ladder %s events/s, warm-up %s, steady window %s; fixed rates %s; 50%%-of-max run: %v; backlogs %s; ceilings %s; grace %s; CHECKPOINT between phases: %v\n",
		p.Name, joinInts(p.Ladder), p.Warmup, p.Steady, joinInts(p.FixedRates), p.HalfMax, joinInts(p.Drains), p.CeilingDuration, p.Grace, p.Checkpoint)
	if len(filterScenario(rep.Results, "consume")) > 0 {
		w("- Consume: a backlog of %s events over %s keys (uniform, 256-byte payload) per consumer\n", commas(int64(p.ConsumeEvents)), commas(int64(p.ConsumeKeys)))
	}
	for i, o := range rep.Order {
		w("- Order, repeat %d: %s\n", i+1, strings.Join(o, ", "))
	}
	w("\n## How CPU and memory are measured\n\n")
	w("- Relay: utime+stime of the relay child process (`/proc/<pid>/stat`), from the moment it is told to start to the end of the phase; peak RSS is its VmHWM (`/proc/<pid>/status`).\n")
	w("- PostgreSQL (the columns without a qualifier): utime+stime of the bench's own backends (found in `pg_stat_activity` by application_name `ferrybench-…`: the producers, the bench's bookkeeping and the relay's connections) plus the cluster's background processes (WAL writer, checkpointer, background writer, autovacuum), sampled at the start and end of the phase. It includes the producers' transactions, so it is the whole system's database cost, not the relay's alone.\n")
	w("- PostgreSQL, whole cluster (`postgres_all_s` in results.jsonl, and the drain table): the sum over every postmaster of its own utime+stime, its cutime+cstime (children that exited and were reaped) and the utime+stime of its live children. It is exact even when backends come and go, but counts every other client of the same server too.\n")
	w("- NATS: utime+stime of the nats-server process. Per-10k figures divide by events delivered (by transactions committed for the ceilings; by distinct events applied for the consumers). USER_HZ is taken as 100.\n")
	w("- Consumers: the consumer child's CPU and peak RSS as the relay's; PostgreSQL as above (the consumer's connections and the bench's polling of the projection, plus the background processes).\n")
}

func cpuOf(r Result, which string) (float64, bool) {
	if r.CPUPer10k == nil {
		return 0, false
	}
	switch which {
	case "relay":
		return r.CPUPer10k.Relay, true
	case "postgres":
		return r.CPUPer10k.Postgres, true
	case "nats":
		return r.CPUPer10k.NATS, true
	case "postgres-all":
		return r.CPUPer10k.PostgresAll, true
	}
	return 0, false
}

func cpuCell(r Result, which string) string {
	if x, ok := cpuOf(r, which); ok {
		return fmt.Sprintf("%.2f", x)
	}
	return "—"
}

func latCell(l *Latency) string {
	if l == nil {
		return "—"
	}
	s := fmt.Sprintf("%s / %s / %s / %s", ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max))
	if l.Lost > 0 {
		s += fmt.Sprintf(" (%s not received)", commas(l.Lost))
	}
	return s
}

func filterScenario(rs []Result, scenario string) []Result {
	var out []Result
	for _, r := range rs {
		if r.Scenario == scenario {
			out = append(out, r)
		}
	}
	return out
}

func sumOf(rs []Result, f func(Result) int64) int64 {
	var s int64
	for _, r := range rs {
		s += f(r)
	}
	return s
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = commas(int64(x))
	}
	return strings.Join(s, ", ")
}

func shortN(n int) string {
	switch {
	case n >= 1000000 && n%1000000 == 0:
		return strconv.Itoa(n/1000000) + "M"
	case n >= 1000 && n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func errSuffix(r Result) string {
	if r.Error == "" {
		return ""
	}
	return " ERROR: " + r.Error
}

func writeCeilings(w func(string, ...any), v view, rep *Report) {
	p := rep.Profile
	w("## Ceilings\n\n")
	w("Producer transactions with no relay running (`BEGIN; UPDATE accounts …; <contender's insert of 1 event>; COMMIT`, %d producers, closed loop, %s each):\n\n", rep.Machine.Producers, p.CeilingDuration)
	w("| Contender | tx/s, synchronous_commit on | tx/s, off | PostgreSQL CPU-s / 10k tx (on) |\n|---|---|---|---|\n")
	for _, c := range v.contenders() {
		on := v.find(c, "ceiling", "sync-on")
		off := v.find(c, "ceiling", "sync-off")
		if len(on)+len(off) == 0 {
			continue
		}
		tps := func(r Result) (float64, bool) { return r.ProducerTPS, r.ProducerTPS > 0 }
		w("| %s | %s | %s | %s |\n", c, fmtNum(statOf(on, tps)), fmtNum(statOf(off, tps)), fmtStat(statOf(on, func(r Result) (float64, bool) { return cpuOf(r, "postgres") }), "%.2f"))
	}
	if js := v.find("jetstream", "ceiling", ""); len(js) > 0 {
		w("\nPublish-only through the shared sink (pre-built events, no database; the publisher runs in the child process):\n\n")
		w("| Mode | events | events/s to the bench's consumer | publisher CPU-s / 10k | NATS CPU-s / 10k | missing | duplicates |\n|---|---|---|---|---|---|---|\n")
		for _, mode := range []string{"publish-async", "publish-sync"} {
			rs := v.find("jetstream", "ceiling", mode)
			if len(rs) == 0 {
				continue
			}
			label := map[string]string{"publish-async": "async (1,000 per call, window 256)", "publish-sync": "sync (1 in flight)"}[mode]
			w("| %s | %s | %s | %s | %s | %s | %s |\n", label, commas(int64(rs[0].Events)),
				fmtNum(statOf(rs, func(r Result) (float64, bool) { return r.DrainRate, r.DrainRate > 0 })),
				fmtStat(statOf(rs, func(r Result) (float64, bool) { return cpuOf(r, "relay") }), "%.2f"),
				fmtStat(statOf(rs, func(r Result) (float64, bool) { return cpuOf(r, "nats") }), "%.2f"),
				commas(sumOf(rs, func(r Result) int64 { return r.Missing })), commas(sumOf(rs, func(r Result) int64 { return r.Duplicates })))
		}
	}

}

// writeConsumers writes the consume scenario's table, one row per run.
func writeConsumers(w func(string, ...any), rep *Report, rs []Result) {
	w("\n## Consumers: applying a backlog with exactly-once effect\n\n")
	w("Each consumer runs alone in its own schema, in the child process, over a backlog written before it starts, and applies every event with the same upsert (`INSERT INTO projection AS t (customer, orders, last_seq) VALUES ($key, 1, $seq) ON CONFLICT (customer) DO UPDATE SET orders = t.orders + 1, last_seq = excluded.last_seq`; one multi-row statement over `unnest` for Ferry's batch handler) in the transaction that records the event as done. Events/s: distinct events applied over the time from the start signal to the last applying COMMIT. Apply transaction: a transaction that applied events, from BEGIN sent to COMMIT returned (pgx tracer in the child), with the events it applied on average. Exactly once: the projection's sum(orders) must be the backlog and each key's orders its count of events, and the consumer's committed applies must hold each event once. Inversions: events applied (in their key's commit order, from the upsert's RETURNING orders) after an event of the same key with a higher sequence.\n\n")
	w("| Consumer | Backlog (keys) | Preload | First apply s | Apply s | events/s | Apply tx p50 / p99 ms | Events / tx | Consumer CPU-s / 10k | PostgreSQL CPU-s / 10k | Peak RSS | sum(orders) | Missing | Duplicates | Order inversions |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		if r.Error != "" {
			w("| %s | %s | ERROR: %s | | | | | | | | | | | | |\n", r.Contender, commas(int64(r.Events)), r.Error)
			continue
		}
		rate := num(r.DrainRate)
		missing := commas(r.Missing)
		if r.TimedOut {
			rate = fmt.Sprintf("timed out (%s not applied)", commas(r.Undelivered))
			missing = "—"
		}
		tx := "—"
		if l := r.ApplyTx; l != nil {
			tx = ms(l.P50) + " / " + ms(l.P99)
		}
		inv := commas(r.Inversions)
		if !rep.Ordered[r.Contender] && r.Inversions > 0 {
			inv += " (no per-key order promised)"
		}
		preload, _, _ := strings.Cut(strings.TrimPrefix(r.Note, "preload "), ";")
		w("| %s | %s (%s) | %s | %.2f | %.2f | %s | %s | %.1f | %s | %s | %s | %s | %s | %s | %s |\n", r.Contender, commas(int64(r.Events)), commas(int64(r.Keys)), preload,
			r.FirstDelivery, r.DrainSeconds, rate, tx, r.EventsPerTx, cpuCell(r, "relay"), cpuCell(r, "postgres"), mib(r.RelayPeakRSS), commas(r.Applied), missing, commas(r.Duplicates), inv)
	}
	var notes []string
	for _, r := range rs {
		if _, rest, ok := strings.Cut(r.Note, "; "); ok {
			notes = append(notes, fmt.Sprintf("- %s (repeat %d): %s", r.Contender, r.Repeat, rest))
		}
	}
	if len(notes) > 0 {
		w("\nNotes:\n\n%s\n", strings.Join(notes, "\n"))
	}
}
