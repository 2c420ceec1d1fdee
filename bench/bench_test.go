package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/bench"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
)

// TestMain lets the test binary serve as the relay child: the runner
// re-executes it with FERRY_BENCH_RELAY=1 and "relay <flags>".
func TestMain(m *testing.M) {
	if os.Getenv(bench.RelayEnv) == "1" {
		args := os.Args[1:]
		if len(args) > 0 && args[0] == "relay" {
			args = args[1:]
		}
		os.Exit(bench.RelayMain(args, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// unavailable skips the test, or fails it under CI=true.
func unavailable(t *testing.T, service, envVar string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s is not reachable (%v): set %s to a server to run this test", service, err, envVar)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: failing instead of skipping)")
	}
	t.Skip(msg)
}

func services(t *testing.T) (pgURL, natsURL string) {
	t.Helper()
	pgURL = envOr("FERRY_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	natsURL = envOr("FERRY_TEST_NATS_URL", nats.DefaultURL)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		unavailable(t, "PostgreSQL", "FERRY_TEST_PG_URL", err)
	}
	_ = conn.Close(ctx)
	nc, err := nats.Connect(natsURL, nats.Timeout(3*time.Second))
	if err != nil {
		unavailable(t, "NATS", "FERRY_TEST_NATS_URL", err)
	}
	nc.Close()
	return pgURL, natsURL
}

// smokeProfile is seconds long; -short makes it shorter still.
func smokeProfile() *bench.Profile {
	p := &bench.Profile{
		Name:            "smoke",
		CeilingDuration: 500 * time.Millisecond,
		ProduceDuration: 700 * time.Millisecond,
		PublishCount:    2000,
		Ladder:          []int{300},
		Warmup:          500 * time.Millisecond,
		Steady:          1500 * time.Millisecond,
		FixedRates:      []int{300},
		Drains:          []int{3000},
		Grace:           2 * time.Second,
		MaxWait:         10 * time.Second,
		DrainMaxWait:    30 * time.Second,
		MaxEvents:       100000,
		ConsumeEvents:   1000,
		ConsumeKeys:     100,
	}
	if testing.Short() {
		p.Steady = time.Second
		p.Drains = []int{1000}
		p.PublishCount = 1000
	}
	return p
}

// TestQuickSmoke runs a seconds-long profile with Ferry and one baseline
// through the whole pipeline: relay child processes, the JetStream
// consumer, the checks and the report; and the consume scenario with two
// of Ferry's consumers.
func TestQuickSmoke(t *testing.T) {
	pgURL, natsURL := services(t)
	out := t.TempDir()
	var log bytes.Buffer
	start := time.Now()
	rep, err := bench.Run(context.Background(), &bench.Options{
		DatabaseURL:  pgURL,
		NATSURL:      natsURL,
		Out:          out,
		Contenders:   []string{"ferry", "naive-claim"},
		Consumers:    []string{"ferry-inbox", "ferry-inbox-batch-handler"},
		Producers:    8,
		Keys:         100,
		SchemaPrefix: fmt.Sprintf("benchtest_%d_", time.Now().UnixNano()%1e6),
		Profile:      smokeProfile(),
		Log:          &log,
	})
	t.Logf("run took %s", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}

	var ferryDelivered int64
	consumed := map[string]bool{}
	for _, r := range rep.Results {
		if r.Error != "" {
			t.Errorf("%s %s %s: %s", r.Contender, r.Scenario, r.Param, r.Error)
		}
		if r.Scenario == "consume" {
			consumed[r.Contender] = true
			if r.Applied != int64(r.Events) || r.Delivered != int64(r.Events) || r.Missing != 0 || r.Duplicates != 0 || r.Inversions != 0 || r.TimedOut {
				t.Errorf("%s consume: applied %d (sum(orders) %d) of %d, %d missing, %d duplicates, %d inversions, timed out %v",
					r.Contender, r.Delivered, r.Applied, r.Events, r.Missing, r.Duplicates, r.Inversions, r.TimedOut)
			}
			if r.ApplyTx == nil || r.DrainRate <= 0 {
				t.Errorf("%s consume: no apply transactions timed (%v) or no rate (%v)", r.Contender, r.ApplyTx, r.DrainRate)
			}
			continue
		}
		if r.Contender != "ferry" {
			continue
		}
		if r.Missing != 0 || r.Undelivered != 0 {
			t.Errorf("ferry %s %s: %d missing, %d undelivered", r.Scenario, r.Param, r.Missing, r.Undelivered)
		}
		if r.Inversions != 0 {
			t.Errorf("ferry %s %s: %d per-key order inversions", r.Scenario, r.Param, r.Inversions)
		}
		if r.Scenario != "latency" { // latency rows repeat ladder rows
			ferryDelivered += r.Delivered
		}
	}
	if ferryDelivered == 0 {
		t.Errorf("ferry delivered nothing\n%s", log.String())
	}
	if len(consumed) != 2 {
		t.Errorf("consume ran for %v, want ferry-inbox and ferry-inbox-batch-handler", consumed)
	}

	for _, name := range []string{"summary.md", "chart.png", "results.jsonl", "relay.log"} {
		fi, err := os.Stat(filepath.Join(out, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if name != "relay.log" && fi.Size() == 0 {
			t.Errorf("%s is empty", name)
		}
	}
	png, err := os.ReadFile(filepath.Join(out, "chart.png"))
	if err == nil && !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Error("chart.png is not a PNG")
	}
	summary, _ := os.ReadFile(filepath.Join(out, "summary.md"))
	for _, want := range []string{"## Overview", "| ferry |", "| naive-claim |", "## Ceilings", "## Correctness", "## Consumers", "| ferry-inbox-batch-handler |", "PostgreSQL 15"} {
		if !strings.Contains(string(summary), want) && !(want == "PostgreSQL 15" && strings.Contains(string(summary), "PostgreSQL ")) {
			t.Errorf("summary.md lacks %q", want)
		}
	}
	lines := bytes.Split(bytes.TrimSpace(mustRead(t, filepath.Join(out, "results.jsonl"))), []byte("\n"))
	for i, line := range lines {
		var r bench.Result
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("results.jsonl line %d: %v", i+1, err)
		}
	}
	if len(lines) != len(rep.Results) {
		t.Errorf("results.jsonl has %d lines for %d results", len(lines), len(rep.Results))
	}
	if t.Failed() {
		t.Logf("log:\n%s", log.String())
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
