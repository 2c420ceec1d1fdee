package ferry

import (
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/prometheus/client_golang/prometheus"
)

type relayMetrics struct {
	published, batches, retries, deadLetters, checkpoints, duplicates, parkedEvents prometheus.Counter
	batchSize, publishSeconds                                                       prometheus.Observer
	lagEvents, lagSeconds, leader, parkedKeys, heldKeys                             prometheus.Gauge
	removed                                                                         *prometheus.CounterVec
}

// newRelayMetrics registers the relay's metrics with reg (none if nil),
// labelled by feed.
func newRelayMetrics(reg prometheus.Registerer, feed string) (*relayMetrics, error) {
	labels := prometheus.Labels{"feed": feed}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Subsystem: "relay", Name: name, Help: help, ConstLabels: labels})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Subsystem: "relay", Name: name, Help: help, ConstLabels: labels})
	}
	bs := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "ferry", Subsystem: "relay", Name: "batch_size", Help: "Events per published batch.", ConstLabels: labels,
		Buckets: prometheus.ExponentialBuckets(1, 4, 7)})
	ps := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "ferry", Subsystem: "relay", Name: "publish_seconds", Help: "Time to publish one batch until every event was acknowledged.", ConstLabels: labels,
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)})
	m := &relayMetrics{
		published:      counter("events_published_total", "Events acknowledged by the sink."),
		batches:        counter("batches_total", "Batches published."),
		retries:        counter("publish_retries_total", "Event publish attempts that failed and were retried."),
		deadLetters:    counter("dead_letters_total", "Events dead-lettered by the relay."),
		checkpoints:    counter("checkpoints_total", "Checkpoints saved."),
		duplicates:     counter("destination_duplicates_total", "Publishes the destination dropped as duplicates (redeliveries after a crash or retry)."),
		batchSize:      bs,
		publishSeconds: ps,
		lagEvents:      gauge("lag_events", fmt.Sprintf("Events committed but not yet passed by the checkpoint, refreshed every heartbeat: exact up to %d, estimated beyond (see ferrydriver.FeedLag).", ferrydriver.ExactCountLimit)),
		lagSeconds:     gauge("lag_seconds", "Age of the oldest event not yet published."),
		leader:         gauge("leader", "1 while this relay holds the feed's lease."),
		parkedEvents:   counter("parked_events_total", "Events set aside because their key's destination did not acknowledge it in time."),
		parkedKeys:     gauge("parked_keys", "Keys whose events are set aside and published from the store (this leader's view)."),
		heldKeys:       gauge("held_keys", "Parked keys held by DeadPolicy Hold until an operator releases them."),
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Subsystem: "relay", Name: "retention_removed_total",
			Help: "Rows the relay's retention pass removed, by kind: events (published), keys (idle, delivered), dead_letters (expired).", ConstLabels: labels}, []string{"kind"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.published, m.batches, m.retries, m.deadLetters, m.checkpoints, m.duplicates, bs, ps, m.lagEvents, m.lagSeconds, m.leader, m.parkedEvents, m.parkedKeys, m.heldKeys, m.removed} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("ferry: register relay metrics for feed %s: %w", feed, err)
			}
		}
	}
	return m, nil
}

type consumerMetrics struct {
	outcomes       *prometheus.CounterVec
	rescues        prometheus.Counter
	handlerSeconds prometheus.Observer
	inbox          *prometheus.GaugeVec
}

// newConsumerMetrics registers a consumer's metrics with reg (none if nil),
// labelled by group.
func newConsumerMetrics(reg prometheus.Registerer, group string) (*consumerMetrics, error) {
	labels := prometheus.Labels{"group": group}
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Subsystem: "consumer", Name: "attempts_total",
		Help: "Handler attempts by outcome: processed, retried, dead, claim_lost, skipped (no handler, SkipUnhandled), not_begun (no transaction: not counted).", ConstLabels: labels}, []string{"outcome"})
	rescues := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Subsystem: "consumer", Name: "rescues_total",
		Help: "Events run again, alone, after their last claim expired (the process crashed, or the handler outlived ClaimTTL).", ConstLabels: labels})
	hs := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "ferry", Subsystem: "consumer", Name: "handler_seconds",
		Help: "Time from claim to commit of one event, handler included.", ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)})
	inbox := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ferry", Subsystem: "consumer", Name: "inbox_rows",
		Help: "Unfinished inbox rows by state (pending, processing, failed, dead), each counted up to 10,000, refreshed every 15 s by one process of the group.", ConstLabels: labels}, []string{"state"})
	if reg != nil {
		for _, c := range []prometheus.Collector{outcomes, rescues, hs, inbox} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("ferry: register consumer metrics for group %s: %w", group, err)
			}
		}
	}
	return &consumerMetrics{outcomes: outcomes, rescues: rescues, handlerSeconds: hs, inbox: inbox}, nil
}

// settleWait observes how long AwaitSettled calls wait, by outcome.
var settleWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ferry", Subsystem: "settlement", Name: "wait_seconds",
	Help: "Time AwaitSettled waited, by outcome: settled, failed, pending (deadline).", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)},
	[]string{"outcome"})

// SettlementCollector returns the collector of AwaitSettled's metrics
// (ferry_settlement_wait_seconds); register it with your registry.
func SettlementCollector() prometheus.Collector { return settleWait }
