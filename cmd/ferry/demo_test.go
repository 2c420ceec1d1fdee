package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
	"github.com/stretchr/testify/require"
)

// demoEvents lets a profile run the demo at full size:
// FERRY_DEMO_TEST_EVENTS=20000 go test -run TestDemo -cpuprofile cpu.out
func demoEvents(t *testing.T, def int) int {
	if v := os.Getenv("FERRY_DEMO_TEST_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return def
}

// TestDemo runs `ferry demo` in-process, small: every check must pass and
// the summary must say so.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := runDemo(ctx, demoConfig{dir: t.TempDir(), events: demoEvents(t, 2000), keys: 50, producers: 4, seed: 1, out: &out, interval: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Log("\n" + out.String())
	require.True(t, rep.ok(), "every check passes")
	require.EqualValues(t, rep.Produced, rep.Applied)
	require.Contains(t, out.String(), "All checks passed")
	require.NotContains(t, out.String(), "FAIL")
	require.Contains(t, out.String(), "4 producers create 2,000 orders for 50 customers, as fast as they can;")
}

// TestDemoSaysOneRight runs the binary with one of everything: the banner
// says "1 producer creates 1 order for 1 customer, as fast as it can" (it
// said "1 producers create 1 orders").
func TestDemoSaysOneRight(t *testing.T) {
	t.Parallel()
	code, out, errOut := ferryBinary(t, "demo", "--events", "1", "--keys", "1", "--producers", "1")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "produce  1 producer creates 1 order for 1 customer, as fast as it can;")
	require.Contains(t, out, "All checks passed")
}

// TestDemoNamesAnUnusableDir: a --dir that cannot be created (a file is in
// the way: refused even to root) is a usage error naming --dir, with what
// to do.
func TestDemoNamesAnUnusableDir(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	code, _, errOut := ferryBinary(t, "demo", "--dir", filepath.Join(file, "demo"))
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "--dir "+filepath.Join(file, "demo")+": ")
	require.Contains(t, errOut, "choose a directory you can write to")
}

// TestDemoInterruptedBinary: SIGINT (Ctrl-C) to the running binary ends the
// demo with "interrupted" and exit 130, not "context canceled".
func TestDemoInterruptedBinary(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(ferryBin, "demo", "--events", "200000", "--rate", "1000")
	cmd.Dir = t.TempDir()
	var out, errOut syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "produce") }, time.Minute, 20*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, errOut.String())
	require.Equal(t, 130, exit.ExitCode(), errOut.String())
	require.Equal(t, "ferry demo: interrupted\n", errOut.String())
}

// TestDemoCrash: the same with the relay and the consumer killed at random
// moments; nothing lost, nothing applied twice, every key in order.
func TestDemoCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := runDemo(ctx, demoConfig{dir: t.TempDir(), events: demoEvents(t, 4000), keys: 50, producers: 4, rate: 1000, crash: true, seed: 2, out: &out, interval: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Log("\n" + out.String())
	require.True(t, rep.ok(), "every check passes")
	require.Positive(t, rep.RelayCrashes+rep.ConsumerCrashes, "crashes happened")
}

func TestDemoRejectsBadFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"demo", "--events", "0"}, &out, &errOut))
	require.Contains(t, errOut.String(), "--events 0: use 1 or more")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(dir+"/ferry.db", nil, 0o600))
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"demo", "--dir", dir}, &out, &errOut))
	require.Contains(t, errOut.String(), "already holds a demo")

	if os.Geteuid() != 0 { // root writes anywhere
		ro := t.TempDir()
		require.NoError(t, os.Chmod(ro, 0o500))
		errOut.Reset()
		require.Equal(t, 2, run(context.Background(), []string{"demo", "--dir", ro}, &out, &errOut))
		require.Contains(t, errOut.String(), "--dir "+ro+": ")
		require.Contains(t, errOut.String(), "choose a directory you can write to")
	}
}

// Ctrl-C during the demo says it was interrupted (exit 130), not "context
// canceled".
func TestDemoInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"demo", "--events", "200000", "--rate", "1000"}, &out, &errOut) }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "produce") }, 30*time.Second, 20*time.Millisecond)
	cancel()
	require.Equal(t, 130, <-done, errOut.String())
	require.Equal(t, "ferry demo: interrupted\n", errOut.String())
}

// TestDemoUI: `ferry demo --ui` keeps its data after the checks and serves
// the console on it, with the token in the address it prints, until Ctrl-C,
// which then ends the demo normally (exit 0).
func TestDemoUI(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(ferryBin, "demo", "--events", "50", "--keys", "5", "--producers", "1", "--ui", "--ui-addr", "127.0.0.1:0")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "FERRY_UI_TOKEN=")
	var out, errOut syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	re := regexp.MustCompile(`The console, on the demo's data: (http://\S+/)#token=([0-9a-f]{32})`)
	var m []string
	require.Eventually(t, func() bool { m = re.FindStringSubmatch(out.String()); return m != nil }, 2*time.Minute, 20*time.Millisecond, "%s%s", out.String(), errOut.String())
	require.Contains(t, out.String(), "All checks passed")
	console, token := m[1], m[2]

	resp, err := http.Get(console)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the console's page")
	get, err := http.NewRequest(http.MethodGet, console+"api/v1/groups", nil)
	require.NoError(t, err)
	get.Header.Set("Authorization", "Bearer "+token)
	resp, err = http.DefaultClient.Do(get)
	require.NoError(t, err)
	var groups struct{ Groups []struct{ Group string } }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&groups))
	resp.Body.Close()
	require.Equal(t, "projection", groups.Groups[0].Group, "the demo's group, on its data")
	req, err := http.NewRequest(http.MethodPost, console+"api/v1/dead-letters/redrive", strings.NewReader(`{"filter":{},"dry_run":true}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the printed token authorises actions")

	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	require.NoError(t, cmd.Wait(), errOut.String())
	require.Contains(t, out.String(), "console stopped")
}
