package ferry

import (
	"errors"
	"fmt"
	"sync"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryhook"
)

// The shapes the runtime records through, named as Prometheus users know
// them.
type (
	counter struct{ in ferryhook.Instrument }
	// gauge keeps its value, so that Inc and Dec can set the next one.
	gauge struct {
		in ferryhook.Instrument
		mu *sync.Mutex
		v  *float64
	}
	observer   struct{ in ferryhook.Instrument }
	counterVec struct{ in ferryhook.Instrument }
	gaugeVec   struct{ in ferryhook.Instrument }
	// labelled is one series of a vector.
	labelled struct {
		in ferryhook.Instrument
		lv string
	}
)

func (c counter) Inc()          { c.in.Add(1) }
func (c counter) Add(v float64) { c.in.Add(v) }
func (g gauge) Set(v float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	*g.v = v
	g.in.Set(v)
}
func (g gauge) Inc() { g.step(1) }
func (g gauge) Dec() { g.step(-1) }
func (g gauge) step(d float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	*g.v += d
	g.in.Set(*g.v)
}
func (o observer) Observe(v float64)                    { o.in.Observe(v) }
func (v counterVec) WithLabelValues(lv string) labelled { return labelled{v.in, lv} }
func (v gaugeVec) WithLabelValues(lv string) labelled   { return labelled{v.in, lv} }
func (v gaugeVec) Reset()                               { v.in.Reset() }
func (l labelled) Inc()                                 { l.in.Add(1, l.lv) }
func (l labelled) Add(v float64)                        { l.in.Add(v, l.lv) }
func (l labelled) Set(v float64)                        { l.in.Set(v, l.lv) }
func (l labelled) Observe(v float64)                    { l.in.Observe(v, l.lv) }

// Add adds n to the series of the label values lv (a vector of several
// labels).
func (v counterVec) Add(n float64, lv ...string) { v.in.Add(n, lv...) }

// exponential returns n buckets from start, each factor times the last.
func exponential(start, factor float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = start
		start *= factor
	}
	return out
}

// metricSet makes the instruments of one part of the runtime.
type metricSet struct {
	hooks  []ferryhook.Hook
	labels map[string]string
	errs   []error
}

func (s *metricSet) make(name, help string, kind ferryhook.MetricKind, labels []string, buckets []float64) ferryhook.Instrument {
	in, err := ferryhook.NewInstrument(s.hooks, &ferryhook.MetricDesc{Name: name, Help: help, Kind: kind, ConstLabels: s.labels, Labels: labels, Buckets: buckets})
	if err != nil {
		s.errs = append(s.errs, err)
		return noInstrument{}
	}
	return in
}

func (s *metricSet) counter(name, help string) counter {
	return counter{s.make(name, help, ferryhook.Counter, nil, nil)}
}

func (s *metricSet) gauge(name, help string) gauge {
	return gauge{in: s.make(name, help, ferryhook.Gauge, nil, nil), mu: new(sync.Mutex), v: new(float64)}
}

type relayMetrics struct {
	published, batches, retries, deadLetters, checkpoints, duplicates, parkedEvents counter
	batchSize, publishSeconds                                                       observer
	lagEvents, lagSeconds, leader, parkedKeys, heldKeys, stuckKeySeconds            gauge
	removed                                                                         counterVec
}

// newRelayMetrics makes the relay's metrics, labelled by feed, with the
// MetricsHooks among hooks (none: nothing is recorded).
func newRelayMetrics(hooks []ferryhook.Hook, feed string) (*relayMetrics, error) {
	s := &metricSet{hooks: hooks, labels: map[string]string{"feed": feed}}
	m := &relayMetrics{
		published:      s.counter("ferry_relay_events_published_total", "Events acknowledged by the sink."),
		batches:        s.counter("ferry_relay_batches_total", "Batches published."),
		retries:        s.counter("ferry_relay_publish_retries_total", "Event publish attempts that failed and were retried."),
		deadLetters:    s.counter("ferry_relay_dead_letters_total", "Events dead-lettered by the relay."),
		checkpoints:    s.counter("ferry_relay_checkpoints_total", "Checkpoints saved."),
		duplicates:     s.counter("ferry_relay_destination_duplicates_total", "Publishes the destination dropped as duplicates (redeliveries after a crash or retry)."),
		batchSize:      observer{s.make("ferry_relay_batch_size", "Events per published batch.", ferryhook.Histogram, nil, exponential(1, 4, 7))},
		publishSeconds: observer{s.make("ferry_relay_publish_seconds", "Time to publish one batch until every event was acknowledged.", ferryhook.Histogram, nil, exponential(0.0005, 2, 14))},
		lagEvents:      s.gauge("ferry_relay_lag_events", fmt.Sprintf("Events committed but not yet passed by the checkpoint, refreshed every heartbeat: exact up to %d, estimated beyond (see ferrydriver.FeedLag).", ferrydriver.ExactCountLimit)),
		lagSeconds:     s.gauge("ferry_relay_lag_seconds", "Age of the oldest event not yet published."),
		leader:         s.gauge("ferry_relay_leader", "1 while this relay holds the feed's lease."),
		parkedEvents:   s.counter("ferry_relay_parked_events_total", "Events set aside because their key's destination did not acknowledge it in time."),
		parkedKeys:     s.gauge("ferry_relay_parked_keys", "Keys whose events are set aside and published from the store (this leader's view)."),
		heldKeys:       s.gauge("ferry_relay_held_keys", "Parked keys held by DeadPolicy Hold until an operator releases them."),
		stuckKeySeconds: s.gauge("ferry_relay_stuck_key_seconds",
			"How long the key waiting longest for its destination's acknowledgement (in flight, retried, parked or held) has waited, refreshed every heartbeat by the leader; 0 when none waits."),
		removed: counterVec{s.make("ferry_relay_retention_removed_total",
			"Rows the relay's retention pass removed, by kind: events (published), keys (idle, delivered), dead_letters (expired).", ferryhook.Counter, []string{"kind"}, nil)},
	}
	if err := errors.Join(s.errs...); err != nil {
		return nil, fmt.Errorf("ferry: relay metrics for feed %s: %w", feed, err)
	}
	return m, nil
}

type consumerMetrics struct {
	ingested       counterVec
	outcomes       counterVec
	rescues        counter
	handlerSeconds observer
	inbox          gaugeVec
}

// newConsumerMetrics makes a consumer's metrics, labelled by group.
func newConsumerMetrics(hooks []ferryhook.Hook, group string) (*consumerMetrics, error) {
	s := &metricSet{hooks: hooks, labels: map[string]string{"group": group}}
	m := &consumerMetrics{
		ingested: counterVec{s.make("ferry_consumer_ingested_events_total",
			"Events delivered to the inbox, by system (the transport they came through: nats, kafka, rabbitmq, webhook, evm, ferry) and result: inserted (new), duplicate (a redelivery of an event it had).",
			ferryhook.Counter, []string{"system", "result"}, nil)},
		outcomes: counterVec{s.make("ferry_consumer_attempts_total",
			"Handler attempts by outcome: processed, retried, dead, claim_lost, skipped (no handler, SkipUnhandled), not_begun (no transaction: not counted).", ferryhook.Counter, []string{"outcome"}, nil)},
		rescues: s.counter("ferry_consumer_rescues_total",
			"Events run again, alone, after their last claim expired (the process crashed, or the handler outlived ClaimTTL)."),
		handlerSeconds: observer{s.make("ferry_consumer_handler_seconds", "Time from claim to commit of one event, handler included.", ferryhook.Histogram, nil, exponential(0.0005, 2, 16))},
		inbox: gaugeVec{s.make("ferry_consumer_inbox_rows",
			"Unfinished inbox rows by state (pending, processing, failed, dead), each counted up to 10,000, refreshed every 15 s by one process of the group.", ferryhook.Gauge, []string{"state"}, nil)},
	}
	if err := errors.Join(s.errs...); err != nil {
		return nil, fmt.Errorf("ferry: consumer metrics for group %s: %w", group, err)
	}
	return m, nil
}

// callMetrics are the metrics of package functions (RunTx, AwaitSettled),
// made on each call from the hooks it is given; a hook that cannot make
// one is skipped, since the call must not fail for its metrics.
type callMetrics struct {
	txCalls, txRetries, settleWait ferryhook.Instrument
}

// noCallMetrics records nothing: RunTx's metrics when no MetricsHook is
// given, which costs a call nothing.
var noCallMetrics = &callMetrics{noInstrument{}, noInstrument{}, noInstrument{}}

// noInstrument records nothing.
type noInstrument struct{}

func (noInstrument) Add(float64, ...string)     {}
func (noInstrument) Set(float64, ...string)     {}
func (noInstrument) Observe(float64, ...string) {}
func (noInstrument) Reset()                     {}

func newCallMetrics(hooks []ferryhook.Hook) *callMetrics {
	if len(ferryhook.Of[ferryhook.MetricsHook](hooks)) == 0 {
		return noCallMetrics
	}
	s := &metricSet{hooks: hooks}
	return &callMetrics{
		txCalls:   s.make("ferry_tx_calls_total", "RunTx calls by outcome: committed, failed, exhausted, commit_unknown.", ferryhook.Counter, []string{"outcome"}, nil),
		txRetries: s.make("ferry_tx_retries_total", "RunTx reruns of the callback, by cause.", ferryhook.Counter, []string{"cause"}, nil),
		settleWait: s.make("ferry_settlement_wait_seconds", "Time AwaitSettled waited, by outcome: settled, failed, pending (deadline).",
			ferryhook.Histogram, []string{"outcome"}, exponential(0.0005, 2, 16)),
	}
}
