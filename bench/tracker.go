package bench

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// tracker holds what one phase knows about its events, all on one clock
// (the driver process's monotonic clock, as ns since base): when each was
// meant to be sent, when its producer's COMMIT returned, and when the
// bench's own JetStream consumer received it.
type tracker struct {
	base time.Time
	n    int

	intended  []int64        // written before the producers start
	started   []int64        // when the producer began the transaction
	committed []atomic.Int64 // 0: not committed (yet)
	received  []atomic.Int64 // first receipt; 0: not received
	stored    []int64        // JetStream's stored time of the first copy (wall clock, as ns since base)

	nCommitted atomic.Int64
	nReceived  atomic.Int64 // distinct events received
	firstRecv  atomic.Int64
	lastRecv   atomic.Int64

	// Consumer-only state (one consumer goroutine; read after it stops or
	// under mu).
	mu         sync.Mutex
	lastSeq    []int64
	duplicates int64
	inversions int64
	foreign    int64 // messages that are not this phase's events
	prodErrors atomic.Int64
}

func newTracker(n, keys int) *tracker {
	return &tracker{
		base:      time.Now(),
		n:         n,
		intended:  make([]int64, n),
		started:   make([]int64, n),
		committed: make([]atomic.Int64, n),
		received:  make([]atomic.Int64, n),
		stored:    make([]int64, n),
		lastSeq:   make([]int64, keys+1),
	}
}

// now is the current time in ns since base, never 0.
func (t *tracker) now() int64 { return max(1, int64(time.Since(t.base))) }

func (t *tracker) commit(g int64) {
	if t.committed[g].CompareAndSwap(0, t.now()) {
		t.nCommitted.Add(1)
	}
}

// receive records one message from the stream, in stream order; stored is
// the time JetStream stored it (zero if unknown).
func (t *tracker) receive(payload []byte, stored time.Time) {
	now := t.now()
	m, err := DecodePayload(payload)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil || m.G < 0 || m.G >= int64(t.n) || m.Key < 0 || m.Key >= len(t.lastSeq) {
		t.foreign++
		return
	}
	if !t.received[m.G].CompareAndSwap(0, now) {
		t.duplicates++
		return
	}
	if !stored.IsZero() {
		// Wall clock against the base's wall clock: the same machine's
		// clock, to well under a millisecond.
		t.stored[m.G] = max(1, int64(stored.Sub(t.base.Round(0))))
	}
	t.nReceived.Add(1)
	t.firstRecv.CompareAndSwap(0, now)
	t.lastRecv.Store(now)
	if m.Seq < t.lastSeq[m.Key] {
		t.inversions++
	} else {
		t.lastSeq[m.Key] = m.Seq
	}
}

func (t *tracker) counts() (dups, inv, foreign int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.duplicates, t.inversions, t.foreign
}

// histMax is the largest latency a histogram records (1 h, in µs); events
// never received are recorded at this value.
const histMax = int64(time.Hour / time.Microsecond)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, histMax, 3) }

// Latency is a latency summary in milliseconds.
type Latency struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
	// Lost counts events in the window that were never received; they are
	// in the percentiles as +1 h.
	Lost int64 `json:"lost,omitempty"`
}

func summarize(h *hdrhistogram.Histogram, lost int64) *Latency {
	if h.TotalCount() == 0 {
		return nil
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return &Latency{
		Count: h.TotalCount(),
		P50:   ms(h.ValueAtQuantile(50)),
		P90:   ms(h.ValueAtQuantile(90)),
		P99:   ms(h.ValueAtQuantile(99)),
		P999:  ms(h.ValueAtQuantile(99.9)),
		Max:   ms(h.Max()),
		Lost:  lost,
	}
}

// latencies computes, over the events whose intended time lies in [from,
// to) ns (every committed event when to == 0), commit→receive,
// intended→receive and commit→stored (JetStream's stored time: the relay's
// share of commit→receive, without the bench consumer's delivery).
func (t *tracker) latencies(from, to int64) (fromCommit, fromIntent, toStored *Latency) {
	hc, hi, hs := newHist(), newHist(), newHist()
	var lost int64
	t.mu.Lock() // stored is written under mu
	defer t.mu.Unlock()
	for g := range t.n {
		it := t.intended[g]
		if to > 0 && (it < from || it >= to) {
			continue
		}
		c := t.committed[g].Load()
		r := t.received[g].Load()
		if c == 0 {
			if to > 0 && it > 0 {
				// Offered in the window but never committed: the producer
				// could not keep up; counts as not delivered.
				lost++
				_ = hi.RecordValue(histMax)
			}
			continue
		}
		if r == 0 {
			lost++
			_ = hc.RecordValue(histMax)
			if it > 0 {
				_ = hi.RecordValue(histMax)
			}
			continue
		}
		_ = hc.RecordValue(max(1, (r-c)/1000))
		if it > 0 {
			_ = hi.RecordValue(max(1, (r-it)/1000))
		}
		if st := t.stored[g]; st != 0 {
			_ = hs.RecordValue(max(1, (st-c)/1000))
		}
	}
	return summarize(hc, lost), summarize(hi, lost), summarize(hs, 0)
}

// txDurations summarizes producer transaction times (BEGIN to COMMIT
// returned) of the events intended in [from, to) (all when to == 0).
func (t *tracker) txDurations(from, to int64) *Latency {
	h := newHist()
	for g := range t.n {
		if it := t.intended[g]; to > 0 && (it < from || it >= to) {
			continue
		}
		if c := t.committed[g].Load(); c != 0 && t.started[g] != 0 {
			_ = h.RecordValue(max(1, (c-t.started[g])/1000))
		}
	}
	return summarize(h, 0)
}

// missing counts committed events never received.
func (t *tracker) missing() int64 {
	var m int64
	for g := range t.n {
		if t.committed[g].Load() != 0 && t.received[g].Load() == 0 {
			m++
		}
	}
	return m
}

// receivedBetween counts events first received in [from, to) ns.
func (t *tracker) receivedBetween(from, to int64) int64 {
	var c int64
	for g := range t.n {
		if r := t.received[g].Load(); r >= from && r < to {
			c++
		}
	}
	return c
}
