package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/ferry-dev/ferry/ferryshared/tcpproxy"
)

// getProbe asks the daemon's probe at url and decodes its JSON answer.
func getProbe(t *testing.T, url string) (int, probeAnswer) {
	t.Helper()
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return 0, probeAnswer{}
	}
	defer resp.Body.Close()
	var a probeAnswer
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&a), "%s answers JSON", url)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	return resp.StatusCode, a
}

// TestReadinessSeesABlackholedSink runs `ferry run` over two partitions
// with its NATS connection through a proxy that then hangs (accepts,
// keeps the connection, answers nothing): /readyz turns unhealthy once the
// checkpoint of a partition with waiting events has not moved for
// --health-stall-after, naming the partition, while /livez stays live (no
// database, no broker in it); once the proxy resumes, /readyz is ready
// again and every event is in the stream once.
func TestReadinessSeesABlackholedSink(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, 2)
	proxy, err := tcpproxy.Start(strings.TrimPrefix(natsURL(), "nats://"))
	require.NoError(t, err)
	defer proxy.Close()
	f.sinkArgs = []string{"--nats-url", "nats://" + proxy.Addr(), "--stream", f.stream, "--subject-prefix", f.prefix, "--create-stream"}
	addr := "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	const stallAfter = 3 * time.Second
	relay := f.start("run", "probe", "--metrics-addr", strings.TrimPrefix(addr, "http://"),
		"--health-stall-after", stallAfter.String(), "--health-stuck-key-age", "0")
	relay.awaitLeader(t, 30*time.Second)

	var a probeAnswer
	require.Eventually(t, func() bool {
		var code int
		code, a = getProbe(t, addr+"/readyz")
		return code == http.StatusOK && len(a.Partitions) == 2 && a.Partitions[0].Leading && a.Partitions[1].Leading
	}, 30*time.Second, 50*time.Millisecond, "ready, leading both partitions: %+v", a)
	require.Equal(t, "ready", a.Status)

	ctx := context.Background()
	var emitted []*ferry.Event
	emit := func(n int) {
		for i := range n {
			ev := &ferry.Event{Topic: "orders", Key: "k" + strconv.Itoa(i), Type: "T"}
			require.NoError(t, f.client.Emit(ctx, ev))
			emitted = append(emitted, ev)
		}
	}
	emit(20)
	f.waitStored(ctx, len(emitted), storedWithin)

	proxy.Hang()
	hung := time.Now()
	emit(20)
	var code int
	require.Eventually(t, func() bool {
		code, a = getProbe(t, addr+"/readyz")
		return code == http.StatusServiceUnavailable
	}, stallAfter+2*time.Minute, 50*time.Millisecond, "/readyz turns unhealthy while the sink hangs")
	reaction := time.Since(hung)
	t.Logf("readiness reaction: /readyz failed %v after the sink hung (--health-stall-after %v)", reaction.Round(time.Millisecond), stallAfter)
	// The checkpoint last "moved" when the idle relay last found nothing
	// waiting, one --poll-interval (50ms) or so before the hang: never
	// sooner than that.
	require.GreaterOrEqual(t, reaction, stallAfter-500*time.Millisecond, "not before the checkpoint stood still for --health-stall-after")
	require.Equal(t, "not ready", a.Status)
	require.NotEmpty(t, a.Reasons)
	for _, r := range a.Reasons {
		require.Equal(t, "stalled", r.Check, "%+v", r)
		require.NotNil(t, r.Partition)
		require.Equal(t, fmt.Sprintf("default/%d", *r.Partition), r.Feed)
		require.Contains(t, r.Message, fmt.Sprintf("partition %d", *r.Partition))
		require.Contains(t, r.Message, "--health-stall-after")
	}
	code, live := getProbe(t, addr+"/livez")
	require.Equal(t, http.StatusOK, code, "a hung sink does not make the process wedged: %+v", live)
	require.Equal(t, "live", live.Status)

	proxy.Resume()
	resumed := time.Now()
	require.Eventually(t, func() bool {
		code, a = getProbe(t, addr+"/readyz")
		return code == http.StatusOK
	}, 2*time.Minute, 50*time.Millisecond, "/readyz recovers with the sink: %+v", a)
	t.Logf("readiness recovery: /readyz ready %v after the sink resumed", time.Since(resumed).Round(time.Millisecond))
	f.waitStored(ctx, len(emitted), storedWithin)
	f.verify(emitted, f.readStream(ctx))
	relay.stop(t)
}

// TestProbeRules checks the rules the binary test does not reach: a
// process that has led nothing for longer than the lease TTL is not ready
// while a partition has no leader (and is once another process leads
// it); a leader whose delivery loop has not turned for twice the lease TTL
// is wedged, and /livez says so; a key waiting past
// --health-stuck-key-age makes it not ready.
func TestProbeRules(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, 2)
	ctx := context.Background()
	hung := make(chan struct{})
	defer close(hung)
	sink := &memsink.Sink{OnPublish: func(ctx context.Context, _ []*ferry.Event) {
		select {
		case <-hung:
		case <-ctx.Done():
		}
	}}
	var relays []*ferry.Relay
	for p := range 2 {
		r, err := ferry.NewRelay(f.drv, sink, &ferry.RelayConfig{Partition: p, HolderID: "probe", LeaseTTL: 5 * time.Second, PollInterval: 20 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, ShutdownTimeout: time.Second})
		require.NoError(t, err)
		relays = append(relays, r)
	}
	dc := &daemonConfig{leaseTTL: 5 * time.Second, healthStallAfter: time.Hour, healthStuckKeyAge: time.Second}
	probe := newPipelineProbe(relays, []int{0, 1}, f.drv, dc)
	live, ready := probeHandlers(func(context.Context) error { return nil }, probe)
	call := func(h http.HandlerFunc) (int, probeAnswer) {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		var a probeAnswer
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &a), "%s", rec.Body)
		return rec.Code, a
	}

	// Nothing led, ever, and no lease held: both partitions are unled.
	code, a := call(ready)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Len(t, a.Reasons, 2, "%+v", a)
	for i, r := range a.Reasons {
		require.Equal(t, "unled", r.Check)
		require.Equal(t, i, *r.Partition)
		require.Contains(t, r.Message, fmt.Sprintf("partition %d (feed default/%d) has no leader", i, i))
	}
	// Another process leads partition 1: only partition 0 is unled.
	_, err := f.drv.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: "default/1", Holder: "elsewhere", TTL: time.Minute})
	require.NoError(t, err)
	code, a = call(ready)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Len(t, a.Reasons, 1, "%+v", a)
	require.Equal(t, 0, *a.Reasons[0].Partition)

	// Partition 0 runs (1 is held elsewhere) and its destination hangs:
	// its key waits past --health-stuck-key-age.
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relays[0].Run(rctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return relays[0].Health().Leading }, 30*time.Second, 10*time.Millisecond)
	for i := 0; ; i++ {
		ev := &ferry.Event{Topic: "t", Key: "k" + strconv.Itoa(i), Type: "T"}
		require.NoError(t, f.client.Emit(ctx, ev))
		if ferrydriver.PartitionOf(ev.Key, 2) == 0 {
			break
		}
	}
	require.Eventually(t, func() bool {
		code, a = call(ready)
		return code == http.StatusServiceUnavailable && len(a.Reasons) == 1 && a.Reasons[0].Check == "stuck_key"
	}, 30*time.Second, 20*time.Millisecond, "%+v", a)
	require.Equal(t, 0, *a.Reasons[0].Partition)
	require.Contains(t, a.Reasons[0].Message, "--health-stuck-key-age")
	require.Contains(t, a.Reasons[0].Message, fmt.Sprintf("key %q", a.Partitions[0].StuckKey))
	code, _ = call(live)
	require.Equal(t, http.StatusOK, code)

	// Seen from an hour later, the leader's loop has not turned: wedged.
	probe.now = func() time.Time { return time.Now().Add(time.Hour) }
	code, a = call(live)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "not live", a.Status)
	require.Len(t, a.Reasons, 1, "%+v", a)
	require.Equal(t, "wedged", a.Reasons[0].Check)
	require.Equal(t, 0, *a.Reasons[0].Partition)
	probe.now = time.Now

	// The relay stops (its lease released): within a lease TTL of having
	// led, the process is not blamed for the unled partition; after it,
	// it is.
	cancel()
	require.NoError(t, <-done)
	done <- nil
	code, a = call(ready)
	require.Equal(t, http.StatusOK, code, "%+v", a)
	probe.now = func() time.Time { return time.Now().Add(dc.leaseTTL + time.Second) }
	code, a = call(ready)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Len(t, a.Reasons, 1, "%+v", a)
	require.Equal(t, "unled", a.Reasons[0].Check)
	require.Equal(t, 0, *a.Reasons[0].Partition)
}
