package bench

import (
	"strings"
	"testing"
)

func TestFerryFailuresGateOnlyFerry(t *testing.T) {
	rep := &Report{Results: []Result{
		{Contender: "ferry", Scenario: "drain", Param: "backlog=10000"},
		{Contender: "ferry", Scenario: "ladder", Param: "rate=5000", TimedOut: true, Undelivered: 900},
		{Contender: "naive-cursor", Scenario: "ladder", Param: "rate=1000", Missing: 12},
		{Contender: "river", Scenario: "ladder", Param: "rate=1000", Inversions: 40},
	}}
	if bad := rep.FerryFailures(); len(bad) != 0 {
		t.Fatalf("baselines' losses and an overloaded Ferry phase must not fail the run: %v", bad)
	}
	rep.Results = append(rep.Results,
		Result{Contender: "ferry", Scenario: "latency", Param: "rate=1000", Missing: 3},
		Result{Contender: "ferry-sqlite", Scenario: "drain", Param: "backlog=10000", Inversions: 1},
		Result{Contender: "ferry", Scenario: "produce", Param: "sync-on", Error: "relay exited during the phase"},
	)
	bad := rep.FerryFailures()
	if len(bad) != 3 || !strings.Contains(bad[0], "3 events missing") || !strings.Contains(bad[1], "1 per-key order inversions") || !strings.Contains(bad[2], "relay exited") {
		t.Fatalf("FerryFailures = %q", bad)
	}
}
