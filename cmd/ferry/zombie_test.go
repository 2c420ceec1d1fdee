package main

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestZombieLeaderPausedPastTheDuplicateWindow pauses the leading relay
// while it drains a backlog, lets a standby take over and finish, waits
// until the stream's duplicate window (1 s) has passed, then resumes the
// old leader: it must hand nothing more to JetStream (its lease is gone;
// every hand-off checks it, and so does every write to the connection).
func TestZombieLeaderPausedPastTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), storedWithin+2*time.Minute)
	defer cancel()
	_, err := f.js.CreateStream(ctx, jetstream.StreamConfig{Name: f.stream, Subjects: []string{f.prefix + ".>"}, Duplicates: time.Second})
	require.NoError(t, err)
	zombiePastTheWindow(ctx, t, f, func() int64 {
		s, err := f.js.Stream(ctx, f.stream)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		return int64(info.State.Msgs)
	})
}

// TestZombieLeaderPausedOnKafka is the same on Kafka (kfake), which keeps
// every copy.
func TestZombieLeaderPausedOnKafka(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.useKafka()
	ctx, cancel := context.WithTimeout(context.Background(), storedWithin+2*time.Minute)
	defer cancel()
	brokers := strings.TrimSuffix(strings.TrimPrefix(f.sinkArgs[1], "kafka://"), "/")
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	require.NoError(t, err)
	defer cl.Close()
	zombiePastTheWindow(ctx, t, f, func() int64 {
		var n int64
		for _, end := range listEnds(ctx, t, cl) {
			n += end
		}
		return n
	})
}

const zombieBatch = 50

// zombiePastTheWindow runs the scenario on f's destination, whose number
// of stored messages stored returns: relay a drains a backlog and is
// paused, b takes over and finishes, the destination stays still (the
// duplicate window passes meanwhile), a resumes and may store only what it
// had handed over before the pause.
func zombiePastTheWindow(ctx context.Context, t *testing.T, f *fixture, stored func() int64) {
	emitted := f.produce(ctx, 20000, 500, 8, 100000) // a backlog, written as fast as it goes
	a := f.startRelay("a", "--batch", strconv.Itoa(zombieBatch))
	a.awaitLeader(t, 30*time.Second)
	require.Eventually(t, func() bool { return stored() > 500 }, 30*time.Second, time.Millisecond, "a drains")
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	paused := stored()
	b := f.startRelay("b")
	b.awaitLeader(t, 30*time.Second)
	f.waitStored(ctx, len(emitted), storedWithin)
	// Let b go idle and the duplicate window pass.
	before := int64(-1)
	require.Eventually(t, func() bool {
		n := stored()
		stable := n == before
		before = n
		return stable
	}, 30*time.Second, 1500*time.Millisecond)
	t.Logf("a paused after %d messages; b finished the drain: %d stored for %d events", paused, before, len(emitted))

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool {
		for _, l := range a.logs.all() {
			if strings.Contains(l, "lost its lease") || strings.Contains(l, "lease not renewed") {
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "the resumed relay notices it lost its lease")
	time.Sleep(2 * time.Second)
	after := stored()
	t.Logf("after a resumed: %d stored (%+d)", after, after-before)
	// Nothing the resumed relay reads or retries is handed over, and what
	// it had handed to the client library before the pause, which the
	// library had not written yet, is not written either: the JetStream
	// connection checks the fence on each write (ferrynats.WriteFence), and
	// franz-go asks each record's fenced context before it builds a
	// request. (Without WriteFence, JetStream stored up to 36 messages of
	// a 50-event call here.)
	require.Zero(t, after-before, "the resumed former leader stored events after it lost its lease")
	a.stop(t)
	b.stop(t)
	// b republished what a had stored past its checkpoint after the
	// window: the destination keeps those copies, so check first copies.
	f.dedup = false
	f.verify(emitted, f.read(ctx))
}
