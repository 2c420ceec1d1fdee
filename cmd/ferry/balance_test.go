package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
)

// leaseWatch samples the partition leases of feed "default" and checks that
// a partition never changes hands without a new term (two leaders of one
// partition would share a term).
type leaseWatch struct {
	t          *testing.T
	f          *fixture
	partitions int
	mu         sync.Mutex
	seen       map[string]*ferrydriver.Lease // partition lease → last seen
	bad        []string
}

// sample reads the leases and checks them against the last seen. The read
// is under the lock too: the watcher and the test's own looks sample
// concurrently, and a read that finished before another's check must not
// be checked after it (it would look like a term going back).
func (w *leaseWatch) sample(ctx context.Context) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	leases, err := w.f.drv.ListLeases(ctx, "default/")
	require.NoError(w.t, err)
	per := map[string]int{}
	for _, l := range leases {
		if prev := w.seen[l.Name]; prev != nil {
			if l.Term < prev.Term || (l.Term == prev.Term && l.Holder != prev.Holder) {
				w.bad = append(w.bad, fmt.Sprintf("%s: %s term %d, then %s term %d", l.Name, prev.Holder, prev.Term, l.Holder, l.Term))
			}
		}
		w.seen[l.Name] = l
		if l.Held(l.Holder) {
			per[strings.SplitN(l.Holder, "#", 2)[0]]++
		}
	}
	return per
}

// balanced reports whether each of names leads between lo and hi of the
// partitions and together they lead all of them.
func balanced(per map[string]int, names []string, partitions, lo, hi int) bool {
	total := 0
	for _, n := range names {
		if per[n] < lo || per[n] > hi {
			return false
		}
		total += per[n]
	}
	return total == partitions
}

// TestRunSharesPartitionsAcrossProcesses: three `ferry run` processes on a
// 12-partition outbox each lead 4 (±1) within two lease TTLs; when one is
// SIGKILLed the other two take its partitions over within two TTLs; no
// partition ever has two leaders; every event is delivered in key order.
func TestRunSharesPartitionsAcrossProcesses(t *testing.T) {
	t.Parallel()
	const partitions, ttl = 12, 3 * time.Second
	f := newFixtureWith(t, partitions)
	ctx, cancel := context.WithTimeout(context.Background(), storedWithin+2*time.Minute)
	defer cancel()
	w := &leaseWatch{t: t, f: f, partitions: partitions, seen: map[string]*ferrydriver.Lease{}}
	stopWatch := make(chan struct{})
	var watching sync.WaitGroup
	watching.Go(func() {
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(50 * time.Millisecond):
			}
			w.sample(ctx)
		}
	})
	defer func() { close(stopWatch); watching.Wait() }()

	start := func(name string) *child {
		return f.start("run", name, "--lease-ttl", ttl.String(), "--migrate=false")
	}
	var emitted []*ferry.Event
	produced := make(chan struct{})
	go func() { emitted = f.produce(ctx, 6000, 200, 4, 300); close(produced) }()

	names := []string{"r1", "r2", "r3"}
	procs := map[string]*child{}
	for _, n := range names {
		procs[n] = start(n)
	}
	started := time.Now()
	require.Eventually(t, func() bool { return balanced(w.sample(ctx), names, partitions, 3, 5) }, 30*time.Second, 50*time.Millisecond,
		"three processes share 12 partitions, 4 (±1) each")
	took := time.Since(started)
	t.Logf("balanced over 3 processes %v after they started (lease TTL %v): %v", took.Round(time.Millisecond), ttl, w.sample(ctx))
	require.Less(t, took, 2*ttl, "balanced within two lease TTLs")

	time.Sleep(ttl) // a while of balanced work
	procs["r3"].kill()
	killed := time.Now()
	require.Eventually(t, func() bool { return balanced(w.sample(ctx), names[:2], partitions, 5, 7) }, 30*time.Second, 50*time.Millisecond,
		"the two left take the dead one's partitions over")
	took = time.Since(killed)
	t.Logf("r3's partitions taken over %v after its SIGKILL: %v", took.Round(time.Millisecond), w.sample(ctx))
	require.Less(t, took, 2*ttl, "taken over within two lease TTLs")

	<-produced
	f.waitStored(ctx, len(emitted), storedWithin)
	for _, n := range names[:2] {
		procs[n].stop(t)
	}
	f.verify(emitted, f.read(ctx))
	w.mu.Lock()
	require.Empty(t, w.bad, "a partition changed hands within a term")
	w.mu.Unlock()
	for _, n := range names[:2] {
		for _, l := range procs[n].logs.all() {
			require.NotContains(t, l, "lost its lease", "%s was fenced off: two leaders of a partition", n)
		}
	}
}
