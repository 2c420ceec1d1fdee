package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
	"github.com/stretchr/testify/require"
)

// The documented example is the defaults: loading it changes nothing.
func TestExampleConfigIsTheDefaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.yaml")
	require.NoError(t, os.WriteFile(path, exampleConfig, 0o600))
	fc, err := loadRunConfig(path)
	require.NoError(t, err)
	var fromFile, defaults daemonConfig
	f1 := newFlags("run", &bytes.Buffer{})
	fromFile.register(f1, fc)
	require.NoError(t, f1.Parse(nil))
	f2 := newFlags("run", &bytes.Buffer{})
	defaults.register(f2, &runConfig{})
	require.NoError(t, f2.Parse(nil))
	require.Equal(t, defaults, fromFile)
	require.Equal(t, 500*time.Millisecond, fromFile.poll)
	require.Equal(t, "FERRY", fromFile.stream)
}

func TestConfigMistakesAreExplained(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("relay:\n  batchsize: 3\n"), 0o600))
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"run", "--config", bad}, &out, &errOut))
	require.Contains(t, errOut.String(), `line 2: unknown key "relay.batchsize": the keys under relay are feed, holder, batch_size,`)
	require.Contains(t, errOut.String(), "--print-config")
	require.NotContains(t, errOut.String(), "struct {", "the error names the key, not a Go type")

	require.NoError(t, os.WriteFile(bad, []byte("database:\n  url: postgres://x\nnats:\n  url: nats://x\n  streams: FERRY\n"), 0o600))
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"run", "--config", bad}, &out, &errOut))
	require.Contains(t, errOut.String(), `line 5: unknown key "nats.streams"`)
	require.Contains(t, errOut.String(), "stream, subject_prefix")

	require.NoError(t, os.WriteFile(bad, []byte("relays:\n  batch_size: 3\n"), 0o600))
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"run", "--config", bad}, &out, &errOut))
	require.Contains(t, errOut.String(), `line 1: unknown key "relays": the keys at the top level are data_dir, database, nats, sink, relay, metrics, ui, log`)

	require.NoError(t, os.WriteFile(bad, []byte("relay:\n  poll_interval: often\n"), 0o600))
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"run", "--config=" + bad}, &out, &errOut))
	require.Contains(t, errOut.String(), `"often" is not a duration`)

	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"run", "--config", filepath.Join(dir, "missing.yaml")}, &out, &errOut))
	require.Contains(t, errOut.String(), "missing.yaml")

	out.Reset()
	require.Equal(t, 0, run(context.Background(), []string{"run", "--print-config"}, &out, &errOut))
	require.Equal(t, string(exampleConfig), out.String())
}

// logLines decodes the daemon's JSON log.
func logLines(t *testing.T, s string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "log line %q", sc.Text())
		out = append(out, m)
	}
	return out
}

// TestRunOnEmbeddedDefaults: `ferry run` with nothing configured creates
// the SQLite database and an embedded JetStream in the data directory,
// says so first, and relays what `ferry emit` writes from another
// "process" (another driver on the file) into the stream; a config file
// sets the data directory and the feed.
func TestRunOnEmbeddedDefaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cfg := filepath.Join(dir, "ferry.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("data_dir: "+data+"\nrelay:\n  feed: shop\n  poll_interval: 50ms\nnats:\n  embedded_port: 0\nmetrics:\n  addr: \"off\"\nui:\n  addr: 127.0.0.1:0\n  open_reads: true\n"), 0o600))

	runCtx, stop := context.WithCancel(ctx)
	var logs syncbuf.Buffer
	exit := make(chan int, 1)
	go func() { exit <- run(runCtx, []string{"run", "--config", cfg}, &bytes.Buffer{}, &logs) }()

	var url, api string
	require.Eventually(t, func() bool {
		for _, l := range logLines(t, logs.String()) {
			if l["msg"] == "ferry: embedded NATS server listening" {
				url, _ = l["url"].(string)
			}
			if strings.HasPrefix(l["msg"].(string), "ferry: admin API") {
				api, _ = l["url"].(string)
			}
			if l["msg"] == "ferry: relay is the leader" {
				return url != ""
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "logs:\n%s", logs.String())
	first := logLines(t, logs.String())[0]
	require.Contains(t, first["msg"], "using the embedded defaults")
	// ui.addr serves the admin API, on the embedded database.
	require.NotEmpty(t, api, "ferry run logs where it serves the admin API")
	resp, err := http.Get(api + "feeds")
	require.NoError(t, err)
	var feeds struct{ Feeds []struct{ Feed string } }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&feeds))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "shop/0", feeds.Feeds[0].Feed)

	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"emit", "--data-dir", data, "--topic", "orders", "--key", "o-1", "--type", "OrderPlaced", "--data", `{"n":1}`, "--count", "25"}, &out, &errOut), errOut.String())

	awaitStreamMsgs(t, url, "FERRY", 25, 20*time.Second)

	out.Reset()
	require.Equal(t, 0, run(ctx, []string{"status", "--data-dir", data, "--feed", "shop", "--json"}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), `"feed": "shop/0"`)

	stop()
	require.Equal(t, 0, <-exit, logs.String())
	require.Contains(t, logs.String(), "ferry: stopped")
	require.NotContains(t, logs.String(), "retention failed", "retention cut short by the stop is not a failure")
}

// Without a database URL, commands other than run and demo look for the
// embedded database and say how to get one when it is missing.
func TestCommandsExplainAMissingDatabase(t *testing.T) {
	var out, errOut bytes.Buffer
	t.Setenv("FERRY_DATABASE_URL", "")
	require.Equal(t, 2, run(context.Background(), []string{"status", "--data-dir", t.TempDir()}, &out, &errOut))
	require.Contains(t, errOut.String(), "ferry run")
	require.Contains(t, errOut.String(), "--database-url")
}

// sqlite: URLs work across the operator commands.
func TestSQLiteURLAcrossCommands(t *testing.T) {
	ctx := context.Background()
	db := "sqlite:" + filepath.Join(t.TempDir(), "app.db")
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"migrate", "sql", "--database-url", db}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "CREATE TABLE ferry_outbox")
	out.Reset()
	require.Equal(t, 0, run(ctx, []string{"migrate", "up", "--database-url", db}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "applied 002_inbox")
	out.Reset()
	require.Equal(t, 0, run(ctx, []string{"emit", "--database-url", db, "--topic", "t", "--key", "k", "--type", "T", "--count", "3"}, &out, &errOut), errOut.String())
	require.Len(t, strings.Fields(out.String()), 3)
	out.Reset()
	require.Equal(t, 0, run(ctx, []string{"status", "--database-url", db, "--json"}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), `"lag_events": 3`)
	out.Reset()
	require.Equal(t, 2, run(ctx, []string{"dlq", "list", "--database-url", db, "--group", "g"}, &out, &errOut), errOut.String())
	require.Contains(t, errOut.String(), "--group g: the group does not exist")
	out.Reset()
	require.Equal(t, 2, run(ctx, []string{"bench", "drain", "--database-url", db}, &out, &errOut))
	require.Contains(t, errOut.String(), "needs PostgreSQL")
}

func TestMongoURLMistakesAreExplained(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"status", "--database-url", "mongodb://host:notaport/app"}, &out, &errOut))
	require.Contains(t, errOut.String(), "not a MongoDB URL")
}
