// Package childtest runs a test binary again as a child process, for
// tests that SIGKILL what they test (a consumer, a relay) and check what
// survived.
package childtest

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
	"time"
)

// Ready is what a child prints on its standard output once SIGTERM stops
// it cleanly (before that, a SIGTERM would kill it mid-start).
const Ready = "ferry-test-child-ready"

// SignalReady prints Ready.
func SignalReady() { fmt.Println(Ready) }

// Start starts this test binary again with env added (which selects what
// the child runs: a TestMain or init that sees it) and returns once the
// child printed Ready; the test kills it at the end, if it still runs.
func Start(t testing.TB, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == Ready {
				ready <- true
				_, _ = io.Copy(io.Discard, out)
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("the child process ended before it was ready")
		}
	case <-time.After(time.Minute):
		t.Fatal("the child process was not ready within a minute")
	}
	return cmd
}

// KillRepeatedly SIGKILLs the child kills times, 200 to 600 ms apart (the
// same moments every run), starting a new one with start each time, and
// returns the child running at the end.
func KillRepeatedly(t testing.TB, kills int, start func() *exec.Cmd) *exec.Cmd {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	child := start()
	for range kills {
		time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond)
		if err := child.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait()
		child = start()
	}
	return child
}
