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

	"github.com/ferry-dev/ferry/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// TestUIServesTheAdminAPI runs `ferry ui` on a migrated schema: it serves
// on the address given (port 0: a free one) and prints where, and the
// token it generated; actions need that token; SIGTERM stops it cleanly.
func TestUIServesTheAdminAPI(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	db := []string{"--database-url", pgtest.URL(), "--schema", schema}
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

	resp, err := http.Get(api + "feeds")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

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
