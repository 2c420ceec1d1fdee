package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
)

// The probes of `ferry run` and `ferry relay`.
//
// /livez (and /healthz) fails only when the process is wedged: a leading
// relay whose delivery loop has not turned for longer than its lease
// could last (losing the lease ends every wait of the loop, so a loop
// that does not turn by then never will). It reads no database: an
// outage of the database or of the broker never makes a liveness probe
// restart the process.
//
// /readyz fails, with a JSON body naming the partition and the rule,
// when the database or the broker does not answer, when a partition this
// process leads has events waiting and its checkpoint has not moved for
// --health-stall-after, when a key has waited for its destination for
// longer than --health-stuck-key-age, or when the process has led nothing
// for longer than the lease TTL while a partition has no leader.

// pipelineProbe judges the relays of one process.
type pipelineProbe struct {
	relays     []*ferry.Relay
	partitions []int
	store      ferrydriver.Store
	// stallAfter and stuckKeyAge are the rules' limits (0: the rule is
	// off); leaseTTL is the relays'.
	stallAfter, stuckKeyAge, leaseTTL time.Duration
	// wedgedAfter is how long a leader's loop may go without turning.
	wedgedAfter time.Duration
	now         func() time.Time
}

func newPipelineProbe(relays []*ferry.Relay, partitions []int, store ferrydriver.Store, dc *daemonConfig) *pipelineProbe {
	return &pipelineProbe{
		relays: relays, partitions: partitions, store: store,
		stallAfter: dc.healthStallAfter, stuckKeyAge: dc.healthStuckKeyAge, leaseTTL: dc.leaseTTL,
		// The relay's heartbeat (5 s) turns the loop at the latest; the
		// lease's trust window ends before its TTL.
		wedgedAfter: 2*dc.leaseTTL + 5*time.Second,
		now:         time.Now,
	}
}

// probeReason is one failed check of a probe.
type probeReason struct {
	// Check names the rule: connections, stalled, stuck_key, unled,
	// wedged.
	Check string `json:"check"`
	// Feed and Partition name the partition the rule failed for.
	Feed      string `json:"feed,omitempty"`
	Partition *int   `json:"partition,omitempty"`
	Message   string `json:"message"`
}

// partitionHealth is one relay's state in a probe's answer.
type partitionHealth struct {
	Feed      string `json:"feed"`
	Partition int    `json:"partition"`
	Leading   bool   `json:"leading"`
	// Waiting is the events committed and not passed by the checkpoint;
	// CheckpointStill how long the checkpoint has not moved while they
	// wait (seconds).
	Waiting         int64   `json:"waiting"`
	CheckpointStill float64 `json:"checkpoint_still_seconds"`
	// StuckKey waited longest for its destination, StuckSeconds long.
	StuckKey     string  `json:"stuck_key,omitempty"`
	StuckSeconds float64 `json:"stuck_seconds,omitempty"`
}

// probeAnswer is the JSON body of /livez and /readyz.
type probeAnswer struct {
	Status     string            `json:"status"`
	Reasons    []probeReason     `json:"reasons,omitempty"`
	Partitions []partitionHealth `json:"partitions,omitempty"`
}

func seconds(d time.Duration) float64 {
	return float64(d.Round(time.Millisecond)) / float64(time.Second)
}

// states returns each relay's state, now.
func (p *pipelineProbe) states() ([]ferry.RelayHealth, []partitionHealth) {
	now := p.now()
	hs := make([]ferry.RelayHealth, len(p.relays))
	out := make([]partitionHealth, len(p.relays))
	for i, r := range p.relays {
		h := r.Health()
		hs[i] = h
		ph := partitionHealth{Feed: h.Feed, Partition: p.partitions[i], Leading: h.Leading, Waiting: h.Waiting}
		if h.Leading && h.Waiting > 0 {
			ph.CheckpointStill = seconds(now.Sub(h.Moved))
		}
		if h.StuckKey != "" {
			ph.StuckKey, ph.StuckSeconds = h.StuckKey, seconds(now.Sub(h.StuckSince))
		}
		out[i] = ph
	}
	return hs, out
}

// live returns the reasons the process is wedged (none: it is live).
func (p *pipelineProbe) live() ([]probeReason, []partitionHealth) {
	hs, parts := p.states()
	now := p.now()
	var reasons []probeReason
	for i, h := range hs {
		if h.Leading && now.Sub(h.Turned) > p.wedgedAfter {
			reasons = append(reasons, probeReason{Check: "wedged", Feed: h.Feed, Partition: &p.partitions[i],
				Message: fmt.Sprintf("the relay of partition %d leads but its delivery loop has not turned for %v (more than twice the lease TTL): restart the process", p.partitions[i], now.Sub(h.Turned).Round(time.Second))})
		}
	}
	return reasons, parts
}

// ready returns the reasons the pipeline is not ready (none: it is).
func (p *pipelineProbe) ready(ctx context.Context) ([]probeReason, []partitionHealth) {
	hs, parts := p.states()
	now := p.now()
	var reasons []probeReason
	anyLeading := false
	var lastLed time.Time
	for i, h := range hs {
		part := &p.partitions[i]
		if !h.Leading {
			if h.Since.After(lastLed) {
				lastLed = h.Since
			}
			continue
		}
		anyLeading = true
		if still := now.Sub(h.Moved); p.stallAfter > 0 && h.Waiting > 0 && still > p.stallAfter {
			reasons = append(reasons, probeReason{Check: "stalled", Feed: h.Feed, Partition: part,
				Message: fmt.Sprintf("partition %d (feed %s): %d event(s) waiting and the checkpoint has not moved for %v (--health-stall-after %v): its destination does not acknowledge anything; see the relay's log and `ferry status`",
					*part, h.Feed, h.Waiting, still.Round(time.Second), p.stallAfter)})
		}
		if age := now.Sub(h.StuckSince); p.stuckKeyAge > 0 && h.StuckKey != "" && age > p.stuckKeyAge {
			reasons = append(reasons, probeReason{Check: "stuck_key", Feed: h.Feed, Partition: part,
				Message: fmt.Sprintf("partition %d (feed %s): key %q has waited %v for its destination (--health-stuck-key-age %v); see `ferry parked list`",
					*part, h.Feed, h.StuckKey, age.Round(time.Second), p.stuckKeyAge)})
		}
	}
	if !anyLeading && len(hs) > 0 && now.Sub(lastLed) > p.leaseTTL {
		for i, r := range p.relays {
			l, err := p.store.GetLease(ctx, r.FeedName())
			if err != nil && !errors.Is(err, ferrydriver.ErrNotFound) {
				reasons = append(reasons, probeReason{Check: "connections", Message: "database: read the partitions' leases: " + err.Error()})
				break
			}
			if err == nil && l.Holder != "" && l.Held(l.Holder) {
				continue
			}
			reasons = append(reasons, probeReason{Check: "unled", Feed: r.FeedName(), Partition: &p.partitions[i],
				Message: fmt.Sprintf("partition %d (feed %s) has no leader, and this process has led nothing for %v (more than the lease TTL, %v): its relays cannot take a lease; see the log",
					p.partitions[i], r.FeedName(), now.Sub(lastLed).Round(time.Second), p.leaseTTL)})
		}
	}
	return reasons, parts
}

// writeProbe answers a probe: 200 with status ok, or 503 with the
// reasons.
func writeProbe(w http.ResponseWriter, ok string, reasons []probeReason, parts []partitionHealth) {
	a := probeAnswer{Status: ok, Reasons: reasons, Partitions: parts}
	code := http.StatusOK
	if len(reasons) > 0 {
		a.Status, code = "not "+ok, http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(a)
}

// probeHandlers returns the /livez and /readyz handlers: connections
// checks the database and the broker; pipe, when not nil, judges the
// relays.
func probeHandlers(connections func(context.Context) error, pipe *pipelineProbe) (live, ready http.HandlerFunc) {
	live = func(w http.ResponseWriter, _ *http.Request) {
		var reasons []probeReason
		var parts []partitionHealth
		if pipe != nil {
			reasons, parts = pipe.live()
		}
		writeProbe(w, "live", reasons, parts)
	}
	ready = func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var reasons []probeReason
		if err := connections(ctx); err != nil {
			reasons = append(reasons, probeReason{Check: "connections", Message: err.Error()})
		}
		var parts []partitionHealth
		if pipe != nil {
			var more []probeReason
			more, parts = pipe.ready(ctx)
			reasons = append(reasons, more...)
		}
		writeProbe(w, "ready", reasons, parts)
	}
	return live, ready
}
