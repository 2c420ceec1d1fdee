package ferry

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// defaultActivityInterval is how often a relay or consumer records what
// it did (RelayConfig.ActivityInterval, ConsumerConfig.ActivityInterval).
const defaultActivityInterval = 10 * time.Second

// activityMeter counts what a relay (of a feed partition) or a consumer
// (of a group) does between the samples it records in its store
// (ferrydriver.Admin.RecordActivity): the console's series of
// events per second, failures and latencies come from them, whichever
// process serves it.
type activityMeter struct {
	kind, name, process string

	mu                 sync.Mutex
	start              time.Time
	done, failed, dead int64
	latency, handler   reservoir
	// lagEvents and lagAge are a relay's feed lag as it last read it
	// (lagged); they carry over from one sample to the next.
	lagEvents int64
	lagAge    time.Duration
}

func newActivityMeter(kind, name, process string) *activityMeter {
	return &activityMeter{kind: kind, name: name, process: process, start: time.Now()}
}

// reservoir keeps a uniform sample of up to reservoirSize durations of an
// interval, for its percentiles: a fixed cost whatever the throughput.
type reservoir struct {
	vals []time.Duration
	seen int
}

const reservoirSize = 1024

func (r *reservoir) add(d time.Duration) {
	r.seen++
	if len(r.vals) < reservoirSize {
		r.vals = append(r.vals, d)
		return
	}
	if i := rand.IntN(r.seen); i < reservoirSize {
		r.vals[i] = d
	}
}

// percentiles returns the p50 and p99 of what was added, and empties r.
func (r *reservoir) percentiles() (p50, p99 time.Duration) {
	if len(r.vals) == 0 {
		return 0, 0
	}
	slices.Sort(r.vals)
	at := func(q float64) time.Duration { return r.vals[min(len(r.vals)-1, int(q*float64(len(r.vals))))] }
	p50, p99 = at(0.50), at(0.99)
	r.vals, r.seen = r.vals[:0], 0
	return p50, p99
}

// did counts n events done at now, created at the times given (one per
// event; latency from each), with handler time per event (0: none).
func (m *activityMeter) did(now time.Time, handler time.Duration, created ...time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.done += int64(len(created))
	for _, c := range created {
		if !c.IsZero() {
			m.latency.add(max(0, now.Sub(c)))
		}
		if handler > 0 {
			m.handler.add(handler)
		}
	}
}

// lagged records a relay's feed lag as it now reads it.
func (m *activityMeter) lagged(events int64, age time.Duration) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lagEvents, m.lagAge = events, age
}

// fail counts n failed attempts, of which dead went to the dead letters.
func (m *activityMeter) fail(n, dead int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failed += n
	m.dead += dead
}

// take returns the sample of the interval that ends at now and starts the
// next.
func (m *activityMeter) take(now time.Time) *ferrydriver.ActivitySample {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &ferrydriver.ActivitySample{Kind: m.kind, Name: m.name, Process: m.process, At: now, Interval: now.Sub(m.start),
		Done: m.done, Failed: m.failed, Dead: m.dead, LagEvents: m.lagEvents, LagAge: m.lagAge}
	s.LatencyP50, s.LatencyP99 = m.latency.percentiles()
	s.HandlerP50, s.HandlerP99 = m.handler.percentiles()
	m.start, m.done, m.failed, m.dead = now, 0, 0, 0
	return s
}

// run records a sample every interval until ctx ends, then the last,
// shorter one. A store that cannot record is told once in the log; what
// the meter counted meanwhile goes into the next sample that is recorded.
func (m *activityMeter) run(ctx context.Context, rec ferrydriver.Admin, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	var unsent *ferrydriver.ActivitySample
	record := func(ctx context.Context) {
		s := m.take(time.Now())
		if unsent != nil {
			// The interval the store missed is folded in; its
			// percentiles are lost.
			s.Interval += unsent.Interval
			s.Done, s.Failed, s.Dead = s.Done+unsent.Done, s.Failed+unsent.Failed, s.Dead+unsent.Dead
		}
		err := rec.RecordActivity(ctx, &ferrydriver.RecordActivityParams{Samples: []*ferrydriver.ActivitySample{s}})
		switch {
		case err == nil && failing:
			failing = false
			log.Info("ferry: recording activity for the console works again")
		case err != nil && !failing && ctx.Err() == nil:
			failing = true
			log.Warn("ferry: recording activity for the console failed; retrying every interval (logged once until it works)", "err", err)
		}
		unsent = nil
		if err != nil {
			unsent = s
		}
	}
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			record(fctx)
			cancel()
			return
		case <-t.C:
			record(ctx)
		}
	}
}
