package main

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
	"github.com/stretchr/testify/require"
)

// TestUIServesTheAdminAPI runs `ferry ui` on a migrated schema: it serves
// on the address given (port 0: a free one) and prints where, and the
// token it generated; actions need that token; SIGTERM stops it cleanly.
func TestUIServesTheAdminAPI(t *testing.T) {
	t.Parallel()
	schema := ferrypgtest.Schema(t)
	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	out, code := ferryCmd(t, append([]string{"migrate", "up"}, db...)...)
	require.Equal(t, 0, code, out)

	cmd := exec.Command(ferryBin, append([]string{"ui", "--ui-addr", "127.0.0.1:0"}, db...)...)
	cmd.Env = append(cmd.Environ(), "FERRY_UI_TOKEN=")
	stdout, w, err := os.Pipe()
	require.NoError(t, err)
	defer stdout.Close()
	cmd.Stdout = w
	require.NoError(t, cmd.Start())
	w.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()
	lines := bufio.NewScanner(stdout)
	var api, token string
	for (api == "" || token == "") && lines.Scan() {
		if m := regexp.MustCompile(`on (http://\S+/api/v1/)$`).FindStringSubmatch(lines.Text()); m != nil {
			api = m[1]
		}
		if m := regexp.MustCompile(`token \(Authorization: Bearer …\); set FERRY_UI_TOKEN to choose it: ([0-9a-f]{32})$`).FindStringSubmatch(lines.Text()); m != nil {
			token = m[1]
		}
	}
	require.NotEmpty(t, api, "ferry ui prints where it serves")
	require.NotEmpty(t, token, "ferry ui prints the token it generated")
	go func() {
		for lines.Scan() {
		}
	}()

	read := func(token, host string) int {
		req, err := http.NewRequest("GET", api+"feeds", nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, read(token, ""))
	require.Equal(t, http.StatusUnauthorized, read("", ""), "reads need the token")
	require.Equal(t, http.StatusForbidden, read(token, "rebound.example:9470"), "a foreign Host is refused, token or not")
	require.Equal(t, http.StatusOK, read(token, "localhost"))

	act := func(token string) int {
		req, err := http.NewRequest("POST", api+"dead-letters/redrive", strings.NewReader(`{"filter":{},"dry_run":true}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, act(""))
	require.Equal(t, http.StatusOK, act(token))

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		require.NoError(t, err, "ferry ui exits 0 on SIGTERM")
	case <-time.After(30 * time.Second):
		t.Fatal("ferry ui did not stop within 30 s of SIGTERM")
	}
}

// TestUIReadOnlyAndWhereItListens: `ferry ui` listens on 127.0.0.1:9470
// unless told otherwise (its -h says so); --read-only refuses every action,
// even with the token, and still serves the pages; an address that is not
// loopback is served with a warning that anyone who reaches it can read
// events (0.0.0.0 here: the test connects through 127.0.0.1 only).
func TestUIReadOnlyAndWhereItListens(t *testing.T) {
	t.Parallel()
	out, code := ferryCmd(t, "ui", "-h")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `-ui-addr string\s+address to serve the console.*\(default "127\.0\.0\.1:9470"\)`, strings.ReplaceAll(out, "\n", " "))

	schema := ferrypgtest.Schema(t)
	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	out, code = ferryCmd(t, append([]string{"migrate", "up"}, db...)...)
	require.Equal(t, 0, code, out)

	for _, tc := range []struct {
		name, addr string
		readOnly   bool
	}{{"read-only on loopback", "127.0.0.1:0", true}, {"every address", "0.0.0.0:0", false}} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"ui", "--ui-addr", tc.addr}, db...)
			if tc.readOnly {
				args = append(args, "--read-only")
			}
			cmd := exec.Command(ferryBin, args...)
			cmd.Env = append(os.Environ(), "FERRY_UI_TOKEN=the-token")
			var stderr syncbuf.Buffer
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			lines := bufio.NewScanner(stdout)
			var api, said string
			for api == "" && lines.Scan() {
				said += lines.Text() + "\n"
				if m := regexp.MustCompile(`on http://\S+:(\d+)/api/v1/$`).FindStringSubmatch(lines.Text()); m != nil {
					api = "http://127.0.0.1:" + m[1] + "/api/v1/"
				}
			}
			require.NotEmpty(t, api, "ferry ui prints where it serves: %s", said)
			for lines.Scan() {
				said += lines.Text() + "\n"
				if strings.Contains(lines.Text(), "the console") {
					break
				}
			}
			go func() {
				for lines.Scan() {
				}
			}()
			get, err := http.NewRequest("GET", api+"feeds", nil)
			require.NoError(t, err)
			get.Header.Set("Authorization", "Bearer the-token")
			resp, err := http.DefaultClient.Do(get)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, "pages are served")
			req, err := http.NewRequest("POST", api+"dead-letters/redrive", strings.NewReader(`{"filter":{},"dry_run":true}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer the-token")
			resp, err = http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			if tc.readOnly {
				require.Contains(t, said, "read-only: actions are refused; reads need the token in FERRY_UI_TOKEN")
				require.Equal(t, http.StatusForbidden, resp.StatusCode, "read-only refuses an action with the token")
				require.NotContains(t, stderr.String(), "not only this machine")
			} else {
				require.Equal(t, http.StatusOK, resp.StatusCode, "the token's action")
				require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "not only this machine") }, 10*time.Second, 20*time.Millisecond,
					"ferry ui warns that every address exposes it: %s", stderr.String())
			}
		})
	}
}
