package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// TestSIGTERMWhileAPublishHangs: the webhook receiver never answers; after
// SIGTERM the relay process is gone within --shutdown-timeout plus a second.
func TestSIGTERMWhileAPublishHangs(t *testing.T) {
	t.Setenv("FERRY_WEBHOOK_SECRETS", ferrywebhook.NewSecret())
	var requests atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)

	f := newFixture(t)
	f.sinkArgs = []string{"--sink-url", srv.URL + "/hooks"}
	relay := f.startRelay("hang", "--shutdown-timeout", "2s")
	ctx := context.Background()
	require.NoError(t, f.client.Emit(ctx, &ferry.Event{Topic: "t", Key: "k", Type: "T"}))
	require.Eventually(t, func() bool { return requests.Load() > 0 }, 30*time.Second, 10*time.Millisecond, "the receiver got no request; relay log:\n%s", strings.Join(relay.logs.all(), "\n"))

	require.NoError(t, relay.cmd.Process.Signal(syscall.SIGTERM))
	sent := time.Now()
	select {
	case <-relay.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the relay did not exit within 30 s of SIGTERM; its log:\n%s", strings.Join(relay.logs.all(), "\n"))
	}
	took := time.Since(sent)
	t.Logf("exited %v after SIGTERM (--shutdown-timeout 2s)", took.Round(time.Millisecond))
	require.Less(t, took, 3*time.Second, "ShutdownTimeout (2s) + 1s; log:\n%s", strings.Join(relay.logs.all(), "\n"))
	require.Zero(t, relay.cmd.ProcessState.ExitCode())
	l, err := f.store.GetLease(ctx, "default/0")
	require.NoError(t, err)
	require.False(t, l.Held(l.Holder), "the lease was released")
}

// TestRelayOnAPartitionTheSchemaLacksExits: `ferry relay --partition 5` on a
// one-partition outbox exits non-zero with one line that says what is wrong,
// instead of logging an error many times a second forever.
func TestRelayOnAPartitionTheSchemaLacksExits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	relay := f.startRelay("p5", "--partition", "5")
	select {
	case <-relay.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the relay kept running; its log:\n%s", strings.Join(relay.logs.all(), "\n"))
	}
	require.Equal(t, 1, relay.cmd.ProcessState.ExitCode())
	lines := relay.logs.all()
	last := lines[len(lines)-1]
	require.True(t, strings.HasPrefix(last, "ferry relay: "), last)
	require.Contains(t, last, "partition 5 is out of range")
	errors := 0
	for _, l := range lines {
		if strings.Contains(l, `"level":"ERROR"`) {
			errors++
		}
	}
	require.LessOrEqual(t, errors, 1, "one error, not a retry loop:\n%s", strings.Join(lines, "\n"))
}
