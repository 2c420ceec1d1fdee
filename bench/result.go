package bench

import (
	"fmt"
	"strings"
)

// Result is one (contender, scenario, parameter, repeat) measurement; the
// results folder holds them as JSON lines (results.jsonl).
type Result struct {
	Contender string `json:"contender"`
	Scenario  string `json:"scenario"`
	// Param distinguishes runs of a scenario: "sync-on", "rate=5000",
	// "backlog=100000", "half-max"…
	Param  string `json:"param"`
	Repeat int    `json:"repeat"`

	Rate   int `json:"rate,omitempty"`   // offered events/s (open loop)
	Events int `json:"events,omitempty"` // backlog or publish count
	Keys   int `json:"keys,omitempty"`   // consume: the backlog's keys

	Seconds        float64 `json:"seconds"`
	Offered        int64   `json:"offered,omitempty"`
	Committed      int64   `json:"committed"`
	Delivered      int64   `json:"delivered"`
	ProducerTPS    float64 `json:"producer_tps,omitempty"`
	DeliveredRate  float64 `json:"delivered_per_s,omitempty"`
	DeliveredRatio float64 `json:"delivered_ratio,omitempty"`
	// BacklogSlope is the least-squares slope of (offered − received) over
	// the steady window, events/s per second; SlopeRatio divides it by the
	// rate.
	BacklogSlope float64 `json:"backlog_slope,omitempty"`
	SlopeRatio   float64 `json:"backlog_slope_ratio,omitempty"`
	// Pass: the step met all three sustained-rate criteria.
	Pass *bool  `json:"pass,omitempty"`
	Why  string `json:"why,omitempty"`

	CommitLatency *Latency `json:"commit_to_receive,omitempty"`
	IntentLatency *Latency `json:"intended_to_receive,omitempty"`
	// StoredLatency is commit→stored: from COMMIT returned to JetStream's
	// stored timestamp of the message, the relay's share of commit→receive.
	StoredLatency *Latency `json:"commit_to_stored,omitempty"`
	// ProducerTx is the producer transactions' duration, BEGIN to COMMIT.
	ProducerTx *Latency `json:"producer_tx,omitempty"`

	// Consume: the consumer's transactions that applied events, from
	// BEGIN sent to COMMIT returned, and the events they applied on
	// average; Applied is the projection's sum(orders) after the consumer
	// stopped (Delivered counts distinct events applied).
	ApplyTx     *Latency `json:"apply_tx,omitempty"`
	EventsPerTx float64  `json:"events_per_tx,omitempty"`
	Applied     int64    `json:"applied,omitempty"`

	// Drains and consume: time from the relay's (consumer's) start to the
	// first and to the last delivery (commit of an apply).
	FirstDelivery float64 `json:"first_delivery_s,omitempty"`
	DrainSeconds  float64 `json:"drain_s,omitempty"`
	DrainRate     float64 `json:"drain_per_s,omitempty"`

	CPU          *CPU  `json:"cpu,omitempty"`
	CPUPer10k    *CPU  `json:"cpu_per_10k,omitempty"`
	RelayPeakRSS int64 `json:"relay_peak_rss_bytes,omitempty"`

	Missing        int64  `json:"missing"`
	Undelivered    int64  `json:"undelivered_at_timeout,omitempty"`
	Duplicates     int64  `json:"duplicates"`
	Inversions     int64  `json:"inversions"`
	Foreign        int64  `json:"foreign,omitempty"`
	ProducerErrors int64  `json:"producer_errors,omitempty"`
	TimedOut       bool   `json:"timed_out,omitempty"`
	Note           string `json:"note,omitempty"`
	Error          string `json:"error,omitempty"`
}

// setPer10k scales CPU to 10,000 events (n: delivered, or committed for
// phases without a relay).
func (r *Result) setPer10k(n int64) {
	if r.CPU == nil || n <= 0 {
		return
	}
	f := 10000 / float64(n)
	r.CPUPer10k = &CPU{
		Relay:       r.CPU.Relay * f,
		Postgres:    r.CPU.Postgres * f,
		PostgresAll: r.CPU.PostgresAll * f,
		NATS:        r.CPU.NATS * f,
		Driver:      r.CPU.Driver * f,
		Box:         r.CPU.Box * f,
	}
}

// FerryFailures lists what the run found wrong with Ferry's own contenders
// (ferry, ferry-sqlite, and the ferry-inbox consumers): a phase that failed
// to run, an event missing (its delivery stalled for the grace period, or
// the relay exited), applied twice (consumers) or a key's events out of
// order. A phase that was still delivering when its wait ended (overload)
// is reported, not failed. Baselines are reported, never failed: the
// naive cursor relay loses events by design.
func (rep *Report) FerryFailures() []string {
	var out []string
	for i := range rep.Results {
		r := &rep.Results[i]
		if r.Contender != "ferry" && r.Contender != "ferry-sqlite" && !strings.HasPrefix(r.Contender, "ferry-inbox") {
			continue
		}
		what := r.Contender + " " + r.Scenario + " " + r.Param
		switch {
		case r.Error != "":
			out = append(out, what+": "+r.Error)
		case r.Missing > 0:
			out = append(out, fmt.Sprintf("%s: %d events missing", what, r.Missing))
		case r.Duplicates > 0 && r.Scenario == "consume":
			out = append(out, fmt.Sprintf("%s: %d events applied twice", what, r.Duplicates))
		case r.Inversions > 0:
			out = append(out, fmt.Sprintf("%s: %d per-key order inversions", what, r.Inversions))
		}
	}
	return out
}
