package bench

import (
	"math"
	"testing"
	"time"
)

func TestPayloadRoundTrip(t *testing.T) {
	for _, m := range []Meta{
		{},
		{G: 1, Key: 42, Seq: 7, Intended: 123456789},
		{G: 9999999999999999, Key: 999999, Seq: 9999999999, Intended: math.MaxInt64},
	} {
		p := EncodePayload(m)
		if len(p) != PayloadSize {
			t.Fatalf("payload is %d bytes, want %d", len(p), PayloadSize)
		}
		got, err := DecodePayload(p)
		if err != nil {
			t.Fatalf("decode %q: %v", p, err)
		}
		if got != m {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
	}
	if _, err := DecodePayload([]byte("hello")); err == nil {
		t.Fatal("decoded a foreign payload")
	}
}

func TestEventIDDistinct(t *testing.T) {
	seen := map[string]bool{}
	for g := range int64(1000) {
		id := EventID(42, g).String()
		if seen[id] {
			t.Fatalf("duplicate id for %d", g)
		}
		seen[id] = true
	}
	if EventID(1, 5) == EventID(2, 5) {
		t.Fatal("nonce ignored")
	}
}

func TestTrackerChecks(t *testing.T) {
	tr := newTracker(4, 10)
	for g := range int64(4) {
		tr.commit(g)
	}
	stored := tr.base.Add(5 * time.Millisecond)
	tr.receive(EncodePayload(Meta{G: 0, Key: 1, Seq: 1}), stored)
	tr.receive(EncodePayload(Meta{G: 2, Key: 1, Seq: 3}), time.Time{})
	tr.receive(EncodePayload(Meta{G: 1, Key: 1, Seq: 2}), time.Time{}) // after seq 3: inversion
	tr.receive(EncodePayload(Meta{G: 2, Key: 1, Seq: 3}), time.Time{}) // duplicate
	tr.receive([]byte("other"), time.Time{})
	dups, inv, foreign := tr.counts()
	if dups != 1 || inv != 1 || foreign != 1 {
		t.Fatalf("dups %d inversions %d foreign %d, want 1 1 1", dups, inv, foreign)
	}
	// commit→stored: only event 0 has a stored time.
	tr.committed[0].Store(int64(2 * time.Millisecond))
	if _, _, l := tr.latencies(0, 0); l == nil || l.Count != 1 || math.Abs(l.P50-3) > 0.01 {
		t.Fatalf("commit→stored %+v, want one value of 3 ms", l)
	}
	if m := tr.missing(); m != 1 {
		t.Fatalf("missing %d, want 1", m)
	}
}

func TestSlope(t *testing.T) {
	xs := []float64{0, 1, 2, 3}
	ys := []float64{1, 3, 5, 7}
	if s := slope(xs, ys); math.Abs(s-2) > 1e-9 {
		t.Fatalf("slope %v, want 2", s)
	}
}

func TestParseProcStat(t *testing.T) {
	line := []byte("123 (post gres) S 1 2 3 4 5 6 7 8 9 10 150 50 7 3 20 0 1 0 100 0 0")
	s, ok := parseProcStat(123, line)
	if !ok || s.comm != "post gres" || s.ppid != 1 || s.utime != 150 || s.stime != 50 || s.cutime != 7 || s.cstime != 3 {
		t.Fatalf("parsed %+v (ok %v)", s, ok)
	}
}
