package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryshared/childtest"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// sourceLeaseTTL is the children's ConsumerConfig.SourceLeaseTTL.
const sourceLeaseTTL = 2 * time.Second

// sourceChild is a consumer process of group "billing" reading the
// JetStream durable "billing" (spec: <schema>:<stream>:<subject prefix>)
// with Consume, and applying events with Run, until SIGTERM.
func sourceChild(spec string) int {
	parts := strings.Split(spec, ":")
	schema, stream, prefix, defaults := parts[0], parts[1], parts[2], len(parts) > 3 && parts[3] == "defaults"
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	childtest.SignalReady()
	js, closeNATS, err := childJetStream()
	if err != nil {
		return childFailed(err)
	}
	defer closeNATS()
	scfg := &ferrynats.SourceConfig{Stream: stream, SubjectPrefix: prefix, Durable: "billing", AckWait: time.Second, Batch: 50}
	ccfg := &ferry.ConsumerConfig{Group: "billing", SourceLeaseTTL: sourceLeaseTTL, PollInterval: 20 * time.Millisecond}
	if defaults {
		scfg = &ferrynats.SourceConfig{Stream: stream, SubjectPrefix: prefix, Durable: "billing"}
		ccfg = &ferry.ConsumerConfig{Group: "billing", PollInterval: 20 * time.Millisecond}
	}
	src, err := ferrynats.NewSource(ctx, js, scfg)
	if err != nil {
		return childFailed(err)
	}
	r, err := openReplica(ctx, schema, ccfg)
	if err != nil {
		return childFailed(err)
	}
	return r.run(ctx, stop, src)
}

// TestOneReaderPerDurable: two consumer processes run Consume on one
// JetStream durable. One reads it (it holds the durable's lease), the
// other stands by; when the reader is SIGKILLed, the standby takes over
// within the lease's TTL, and every event is applied once, each key in
// order, across the takeover.
func TestOneReaderPerDurable(t *testing.T) {
	t.Parallel()
	testSourceSIGKILL(t, "kill")
}

// TestJetStreamGroupRecoversFromSIGKILL: the same with the defaults
// (SourceLeaseTTL, ferrynats.SourceConfig.AckWait): it logs the time from
// the reader's SIGKILL to the group applying an event published after it
// (about SourceLeaseTTL), and requires it within the old AckWait (30 s).
// Two replicas reading one durable used to stall each other for twice
// AckWait (60 s) as soon as the second started: each waited for the
// messages the other held.
func TestJetStreamGroupRecoversFromSIGKILL(t *testing.T) {
	t.Parallel()
	testSourceSIGKILL(t, "defaults")
}

// TestPausedReaderStandsBy: the reader is paused (SIGSTOP) past its lease;
// the standby takes over, and once resumed the former reader ingests
// nothing more (it no longer trusts its lease) and stands by: every event
// is applied once, each key in order.
func TestPausedReaderStandsBy(t *testing.T) {
	t.Parallel()
	testSourceSIGKILL(t, "pause")
}

// testSourceSIGKILL runs two consumer processes on one durable and
// SIGKILLs the reader (mode "kill"; "defaults" with the default settings)
// or pauses it past its lease ("pause").
func testSourceSIGKILL(t *testing.T, mode string) {
	defaults := mode == "defaults"
	ctx := context.Background()
	nc := testNATS(t)
	st := newReplicaStore(t)
	pool, drv, schema, table, count := st.pool, st.drv, st.schema, st.effects, st.count
	stream, prefix := strings.ToUpper(schema), schema
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		js, err := jetstream.New(nc)
		if err == nil {
			_ = js.DeleteStream(context.Background(), stream)
		}
	})

	const n, keys, chunk = 3000, 30, 50
	evs := make([]*ferry.Event, n)
	seq := map[string]int64{}
	for i := range evs {
		k := fmt.Sprintf("k%d", i%keys)
		seq[k]++
		evs[i] = &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: k, Type: "OrderPlaced", Seq: seq[k], Payload: []byte(`{}`), CreatedAt: time.Now()}
	}
	publish := func(evs []*ferry.Event) {
		for _, err := range sink.Publish(ctx, evs) {
			require.NoError(t, err)
		}
	}
	publish(evs[:chunk])

	spec := "FERRY_TEST_SOURCE_CHILD=" + schema + ":" + stream + ":" + prefix
	if defaults {
		spec += ":defaults"
	}
	a := childtest.Start(t, spec)
	reader := func() string {
		l, err := drv.GetLease(ctx, "consumer-sources/nats/"+stream+"/billing")
		if err != nil || !l.ExpiresAt.After(l.Now) {
			return ""
		}
		return l.Holder
	}
	holds := func(pid int) bool { return strings.Contains(reader(), fmt.Sprintf("-%d-", pid)) }
	require.Eventually(t, func() bool { return holds(a.Process.Pid) }, time.Minute, 10*time.Millisecond, "the first process reads the durable (holds its lease)")
	b := childtest.Start(t, spec)
	published := make(chan struct{})
	var sent atomic.Int64 // events published
	sent.Store(chunk)
	go func() {
		defer close(published)
		for i := chunk; i < n; i += chunk {
			publish(evs[i : i+chunk])
			sent.Store(int64(i + chunk))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	// While the first lives, it stays the reader: the second stands by.
	require.Eventually(t, func() bool { return count(`SELECT count(*) FROM `+table) >= n/3 }, time.Minute, 10*time.Millisecond)
	require.True(t, holds(a.Process.Pid), "the reader changed while it was alive: %q", reader())

	if mode == "pause" {
		require.NoError(t, a.Process.Signal(syscall.SIGSTOP))
		require.Eventually(t, func() bool { return holds(b.Process.Pid) }, time.Minute, 5*time.Millisecond, "the standby takes the durable over")
		before := count(`SELECT count(*) FROM ` + table)
		require.Eventually(t, func() bool { return count(`SELECT count(*) FROM `+table) > before+100 }, time.Minute, 10*time.Millisecond, "the standby reads")
		require.NoError(t, a.Process.Signal(syscall.SIGCONT))
		<-published
		require.Eventually(t, func() bool { return count(`SELECT count(DISTINCT event_id) FROM `+table) >= n }, 2*time.Minute, 20*time.Millisecond)
		require.True(t, holds(b.Process.Pid), "the resumed reader took the durable back: %q", reader())
		require.NoError(t, a.Process.Signal(syscall.SIGTERM))
		require.NoError(t, a.Wait())
		require.NoError(t, b.Process.Signal(syscall.SIGTERM))
		require.NoError(t, b.Wait())
		st.requireOnceInOrder(n)
		return
	}
	require.NoError(t, a.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	_ = a.Wait()
	// Published after the SIGKILL (the chunk on its way then too might
	// have reached the reader).
	after := evs[min(n, int(sent.Load())+chunk):]
	require.NotEmpty(t, after, "everything was published before the SIGKILL")
	var killedAt time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&killedAt))
	require.Eventually(t, func() bool { return holds(b.Process.Pid) }, time.Minute, 5*time.Millisecond, "the standby takes the durable over")
	takeover := time.Since(killed)
	<-published
	require.Eventually(t, func() bool { return count(`SELECT count(DISTINCT event_id) FROM `+table) >= n }, 2*time.Minute, 20*time.Millisecond)
	require.NoError(t, b.Process.Signal(syscall.SIGTERM))
	require.NoError(t, b.Wait())
	ids := make([]string, len(after))
	for i, ev := range after {
		ids[i] = ev.ID.String()
	}
	var again, pause float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT COALESCE(EXTRACT(EPOCH FROM min(at) - $2::timestamptz), -1)::float8 FROM `+table+` WHERE event_id = ANY($1::uuid[]) AND pid <> $3`, ids, killedAt, a.Process.Pid).Scan(&again))
	require.NoError(t, pool.QueryRow(ctx, `SELECT COALESCE(EXTRACT(EPOCH FROM max(gap)), -1)::float8 FROM (
		SELECT at - lag(at, 1, $1::timestamptz) OVER (ORDER BY at) AS gap FROM `+table+` WHERE at > $1::timestamptz) s`, killedAt).Scan(&pause))
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("the standby took the durable over %v after the reader's SIGKILL; the group applied an event published after the SIGKILL %.3fs after it; its longest pause %.3fs (defaults %v; load average %s)",
		takeover.Round(time.Millisecond), again, pause, defaults, strings.TrimSpace(string(load)))

	st.requireOnceInOrder(n)
	// The lease expires at most a TTL after the reader's last renewal; a
	// loaded machine may add some to the standby's next look.
	if defaults {
		require.Less(t, again, 30.0, "the group waited out the old ack wait")
		return
	}
	require.Less(t, takeover, 2*sourceLeaseTTL, "the standby took over past the lease's TTL")
}
