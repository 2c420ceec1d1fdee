package ferry

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// MetricKind says how a metric is recorded.
type MetricKind int

// The kinds of metrics.
const (
	// Counter only grows: Add.
	Counter MetricKind = iota + 1
	// Gauge is set to a value: Set.
	Gauge
	// Histogram counts observations in buckets: Observe.
	Histogram
)

// MetricDesc describes one of Ferry's metrics. The names, help texts and
// labels are Ferry's documented metrics (docs/observability.md, "Metrics"); a
// MetricsHook records them under those names.
type MetricDesc struct {
	// Name is the full name, for example "ferry_relay_events_published_total".
	Name string
	Help string
	Kind MetricKind
	// ConstLabels hold the labels the instrument always has, for example
	// {"feed": "default/0"} or {"group": "billing"}.
	ConstLabels map[string]string
	// Labels name the labels whose values each recording gives, in order.
	Labels []string
	// Buckets are a histogram's upper bounds, ascending.
	Buckets []float64
}

// Instrument records one metric. Only the method of its kind is called;
// labelValues are the values of MetricDesc.Labels, in order. It must be
// safe for concurrent use.
type Instrument interface {
	Add(v float64, labelValues ...string)
	Set(v float64, labelValues ...string)
	Observe(v float64, labelValues ...string)
	// Reset drops every series of the metric (a gauge another process
	// now reports).
	Reset()
}

// MetricsHook is a Hook that records Ferry's metrics. The relay, the
// consumer, RunTx and AwaitSettled ask it for an Instrument per metric
// they record: the relay and the consumer when they are made (an error
// then fails NewRelay or NewConsumer, for example a metric registered
// twice), RunTx and AwaitSettled on each call (the hook should return the
// same instrument for the same description). Package ferryprom records
// them with Prometheus.
type MetricsHook interface {
	Instrument(d *MetricDesc) (Instrument, error)
}

// NewInstrument returns an Instrument recording d with every MetricsHook
// among hooks (a no-op one when there is none): the relay and the consumer
// make theirs with it, and so can code outside this package that reports
// through the same hooks, as ferrychain does.
func NewInstrument(hooks []Hook, d *MetricDesc) (Instrument, error) {
	var out multiInstrument
	for _, mh := range hooksOf[MetricsHook](hooks) {
		in, err := mh.Instrument(d)
		if err != nil {
			return nil, fmt.Errorf("metric %s: %w", d.Name, err)
		}
		out = append(out, in)
	}
	return out, nil
}

type multiInstrument []Instrument

func (m multiInstrument) Add(v float64, lv ...string) {
	for _, in := range m {
		in.Add(v, lv...)
	}
}

func (m multiInstrument) Set(v float64, lv ...string) {
	for _, in := range m {
		in.Set(v, lv...)
	}
}

func (m multiInstrument) Observe(v float64, lv ...string) {
	for _, in := range m {
		in.Observe(v, lv...)
	}
}

func (m multiInstrument) Reset() {
	for _, in := range m {
		in.Reset()
	}
}

// The shapes the runtime records through, named as Prometheus users know
// them.
type (
	counter struct{ in Instrument }
	// gauge keeps its value, so that Inc and Dec can set the next one.
	gauge struct {
		in Instrument
		mu *sync.Mutex
		v  *float64
	}
	observer   struct{ in Instrument }
	counterVec struct{ in Instrument }
	gaugeVec   struct{ in Instrument }
	// labelled is one series of a vector.
	labelled struct {
		in Instrument
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
	hooks  []Hook
	labels map[string]string
	errs   []error
}

func (s *metricSet) make(name, help string, kind MetricKind, labels []string, buckets []float64) Instrument {
	in, err := NewInstrument(s.hooks, &MetricDesc{Name: name, Help: help, Kind: kind, ConstLabels: s.labels, Labels: labels, Buckets: buckets})
	if err != nil {
		s.errs = append(s.errs, err)
		return multiInstrument(nil)
	}
	return in
}

func (s *metricSet) counter(name, help string) counter {
	return counter{s.make(name, help, Counter, nil, nil)}
}

func (s *metricSet) gauge(name, help string) gauge {
	return gauge{in: s.make(name, help, Gauge, nil, nil), mu: new(sync.Mutex), v: new(float64)}
}

type relayMetrics struct {
	published, batches, retries, deadLetters, checkpoints, duplicates, parkedEvents counter
	batchSize, publishSeconds                                                       observer
	lagEvents, lagSeconds, leader, parkedKeys, heldKeys, stuckKeySeconds            gauge
	removed                                                                         counterVec
}

// newRelayMetrics makes the relay's metrics, labelled by feed, with the
// MetricsHooks among hooks (none: nothing is recorded).
func newRelayMetrics(hooks []Hook, feed string) (*relayMetrics, error) {
	s := &metricSet{hooks: hooks, labels: map[string]string{"feed": feed}}
	m := &relayMetrics{
		published:      s.counter("ferry_relay_events_published_total", "Events acknowledged by the sink."),
		batches:        s.counter("ferry_relay_batches_total", "Batches published."),
		retries:        s.counter("ferry_relay_publish_retries_total", "Event publish attempts that failed and were retried."),
		deadLetters:    s.counter("ferry_relay_dead_letters_total", "Events dead-lettered by the relay."),
		checkpoints:    s.counter("ferry_relay_checkpoints_total", "Checkpoints saved."),
		duplicates:     s.counter("ferry_relay_destination_duplicates_total", "Publishes the destination dropped as duplicates (redeliveries after a crash or retry)."),
		batchSize:      observer{s.make("ferry_relay_batch_size", "Events per published batch.", Histogram, nil, exponential(1, 4, 7))},
		publishSeconds: observer{s.make("ferry_relay_publish_seconds", "Time to publish one batch until every event was acknowledged.", Histogram, nil, exponential(0.0005, 2, 14))},
		lagEvents:      s.gauge("ferry_relay_lag_events", fmt.Sprintf("Events committed but not yet passed by the checkpoint, refreshed every heartbeat: exact up to %d, estimated beyond (see ferrydriver.FeedLag).", ferrydriver.ExactCountLimit)),
		lagSeconds:     s.gauge("ferry_relay_lag_seconds", "Age of the oldest event not yet published."),
		leader:         s.gauge("ferry_relay_leader", "1 while this relay holds the feed's lease."),
		parkedEvents:   s.counter("ferry_relay_parked_events_total", "Events set aside because their key's destination did not acknowledge it in time."),
		parkedKeys:     s.gauge("ferry_relay_parked_keys", "Keys whose events are set aside and published from the store (this leader's view)."),
		heldKeys:       s.gauge("ferry_relay_held_keys", "Parked keys held by DeadPolicy Hold until an operator releases them."),
		stuckKeySeconds: s.gauge("ferry_relay_stuck_key_seconds",
			"How long the key waiting longest for its destination's acknowledgement (in flight, retried, parked or held) has waited, refreshed every heartbeat by the leader; 0 when none waits."),
		removed: counterVec{s.make("ferry_relay_retention_removed_total",
			"Rows the relay's retention pass removed, by kind: events (published), keys (idle, delivered), dead_letters (expired).", Counter, []string{"kind"}, nil)},
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
func newConsumerMetrics(hooks []Hook, group string) (*consumerMetrics, error) {
	s := &metricSet{hooks: hooks, labels: map[string]string{"group": group}}
	m := &consumerMetrics{
		ingested: counterVec{s.make("ferry_consumer_ingested_events_total",
			"Events delivered to the inbox, by system (the transport they came through: nats, kafka, rabbitmq, webhook, evm, ferry) and result: inserted (new), duplicate (a redelivery of an event it had).",
			Counter, []string{"system", "result"}, nil)},
		outcomes: counterVec{s.make("ferry_consumer_attempts_total",
			"Handler attempts by outcome: processed, retried, dead, claim_lost, skipped (no handler, SkipUnhandled), not_begun (no transaction: not counted).", Counter, []string{"outcome"}, nil)},
		rescues: s.counter("ferry_consumer_rescues_total",
			"Events run again, alone, after their last claim expired (the process crashed, or the handler outlived ClaimTTL)."),
		handlerSeconds: observer{s.make("ferry_consumer_handler_seconds", "Time from claim to commit of one event, handler included.", Histogram, nil, exponential(0.0005, 2, 16))},
		inbox: gaugeVec{s.make("ferry_consumer_inbox_rows",
			"Unfinished inbox rows by state (pending, processing, failed, dead), each counted up to 10,000, refreshed every 15 s by one process of the group.", Gauge, []string{"state"}, nil)},
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
	txCalls, txRetries, settleWait Instrument
}

// noCallMetrics records nothing: RunTx's metrics when no MetricsHook is
// given, which costs a call nothing.
var noCallMetrics = &callMetrics{multiInstrument(nil), multiInstrument(nil), multiInstrument(nil)}

func newCallMetrics(hooks []Hook) *callMetrics {
	if len(hooksOf[MetricsHook](hooks)) == 0 {
		return noCallMetrics
	}
	s := &metricSet{hooks: hooks}
	return &callMetrics{
		txCalls:   s.make("ferry_tx_calls_total", "RunTx calls by outcome: committed, failed, exhausted, commit_unknown.", Counter, []string{"outcome"}, nil),
		txRetries: s.make("ferry_tx_retries_total", "RunTx reruns of the callback, by cause.", Counter, []string{"cause"}, nil),
		settleWait: s.make("ferry_settlement_wait_seconds", "Time AwaitSettled waited, by outcome: settled, failed, pending (deadline).",
			Histogram, []string{"outcome"}, exponential(0.0005, 2, 16)),
	}
}

// MetricKey identifies a metric's instrument among others of the same
// name: its name and constant labels. MetricsHook implementations use it
// to return the same instrument for the same description.
func MetricKey(d *MetricDesc) string {
	keys := make([]string, 0, len(d.ConstLabels))
	for k := range d.ConstLabels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(d.Name)
	for _, k := range keys {
		b.WriteString("\x00" + k + "=" + d.ConstLabels[k])
	}
	return b.String()
}
