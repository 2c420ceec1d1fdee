// Command ferry-bench runs Ferry's side-by-side outbox benchmark: Ferry
// (PostgreSQL and SQLite), Watermill, River and two naive polling relays,
// one at a time on the same PostgreSQL and JetStream, then (the consume
// scenario) Ferry's inbox, River with JobCompleteTx and a Watermill-sql
// subscriber applying a backlog with exactly-once effect, and writes
// results.jsonl, summary.md and chart.png to a results folder.
//
//	cd bench && go run ./cmd/ferry-bench --quick
//
// The relay under test runs as a child process (this binary's hidden
// `relay` subcommand) so that its CPU time and peak RSS are its own.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ferry-dev/ferry/bench"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "relay" {
		os.Exit(bench.RelayMain(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args[1:]))
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(args []string) int {
	fs := flag.NewFlagSet("ferry-bench", flag.ContinueOnError)
	var o bench.Options
	var contenders, scenarios, consumers string
	fs.BoolVar(&o.Quick, "quick", false, "smoke-sized run (about 3 minutes): shorter windows, ladder 1k/5k, 10k backlog only")
	fs.StringVar(&o.DatabaseURL, "database-url", env("FERRY_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"), "PostgreSQL URL (env FERRY_DATABASE_URL)")
	fs.StringVar(&o.NATSURL, "nats-url", env("FERRY_NATS_URL", "nats://127.0.0.1:4222"), "NATS URL with JetStream (env FERRY_NATS_URL)")
	fs.StringVar(&o.Out, "out", "results/"+time.Now().Format("20060102-150405"), "results folder")
	fs.StringVar(&contenders, "contenders", strings.Join(bench.AllContenders, ","), "comma-separated contenders")
	fs.StringVar(&scenarios, "scenarios", strings.Join(bench.AllScenarios, ","), "comma-separated scenarios")
	fs.StringVar(&consumers, "consumers", strings.Join(bench.AllConsumers, ","), "comma-separated consumers (consume scenario)")
	fs.IntVar(&o.ConsumeEvents, "consume-events", 0, "consume scenario: backlog per consumer (default 20000, 5000 with --quick)")
	fs.IntVar(&o.ConsumeKeys, "consume-keys", 0, "consume scenario: keys of the backlog (default 500)")
	fs.IntVar(&o.Repeat, "repeat", 1, "repeats (contender order shuffled after the first; medians reported)")
	fs.IntVar(&o.Producers, "producers", 32, "producer connections")
	fs.IntVar(&o.Keys, "keys", 1000, "distinct keys (accounts)")
	fs.BoolVar(&o.CPUProfiles, "cpuprofile", false, "have the relay child write a CPU profile of each phase to <out>/pprof (go tool pprof)")
	fs.BoolVar(&o.Keep, "keep", false, "keep the contenders' schemas afterwards")
	fs.StringVar(&o.SchemaPrefix, "schema-prefix", "bench_", "prefix of the contenders' schema names")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: ferry-bench [flags]\n\nContenders: %s\nScenarios: %s\nConsumers (consume scenario): %s\n\n",
			strings.Join(bench.AllContenders, ", "), strings.Join(bench.AllScenarios, ", "), strings.Join(bench.AllConsumers, ", "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.Contenders = split(contenders)
	o.Scenarios = split(scenarios)
	o.Consumers = split(consumers)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rep, err := bench.Run(ctx, &o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferry-bench:", err)
		return 1
	}
	fmt.Printf("ferry-bench: %d results in %s, written to %s (summary.md, chart.png, results.jsonl)\n", len(rep.Results), time.Since(start).Round(time.Second), o.Out)
	if bad := rep.FerryFailures(); len(bad) > 0 {
		fmt.Fprintf(os.Stderr, "ferry-bench: Ferry failed its correctness checks; see %s/summary.md and relay.log:\n  %s\n", o.Out, strings.Join(bad, "\n  "))
		return 1
	}
	return 0
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
