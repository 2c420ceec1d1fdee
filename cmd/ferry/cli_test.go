package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/ferry-dev/ferry/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// ferryBinary runs the built ferry binary and returns its exit status, stdout
// and stderr.
func ferryBinary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(ferryBin, args...)
	cmd.Dir = t.TempDir()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), out.String(), errOut.String()
	}
	require.NoError(t, err)
	return 0, out.String(), errOut.String()
}

// Every command with subcommands lists them for -h (exit 0), and names an
// unknown one.
func TestSubcommandHelpAndUnknownOnes(t *testing.T) {
	t.Parallel()
	for command, subs := range map[string][]string{
		"migrate":    {"up", "down", "sql"},
		"dlq":        {"list", "show", "redrive", "discard"},
		"partitions": {"show", "set"},
		"parked":     {"list", "release", "skip"},
		"chain":      {"run", "status"},
		"bench":      {"drain", "latency", "consume", "settle", "ingest", "e2e"},
	} {
		for _, help := range []string{"-h", "--help", "help"} {
			code, out, errOut := ferryBinary(t, command, help)
			require.Equal(t, 0, code, "ferry %s %s: %s", command, help, errOut)
			for _, s := range subs {
				require.Contains(t, out, "\n  "+s+" ", "ferry %s %s lists %s", command, help, s)
			}
			require.Contains(t, out, "ferry "+command+" <subcommand> -h")
		}
		code, _, errOut := ferryBinary(t, command, "sideways")
		require.Equal(t, 2, code)
		require.Contains(t, errOut, `unknown subcommand "sideways": ferry `+command+" "+strings.Join(subs, " | "))
		code, _, errOut = ferryBinary(t, command)
		require.Equal(t, 2, code)
		require.Contains(t, errOut, "say what to do: ferry "+command+" "+strings.Join(subs, " | "))
	}
}

// A positional argument a command does not take is refused, not ignored.
func TestUnexpectedArgumentsAreRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"demo", "extra-arg"}, {"status", "x"}, {"migrate", "up", "now"}, {"version", "x"}} {
		code, out, errOut := ferryBinary(t, args...)
		require.Equal(t, 2, code, "ferry %v: %s%s", args, out, errOut)
		require.Contains(t, errOut, `unexpected argument "`+args[len(args)-1]+`"`, "ferry %v", args)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, errOut := ferryBinary(t, "version")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	require.True(t, strings.HasPrefix(lines[0], "ferry "), out)
	require.True(t, strings.HasPrefix(lines[1], "commit "), out)
	require.True(t, strings.HasPrefix(lines[2], "go1."), out)
}

// FERRY_EMIT_HEADERS sets emit's headers (one name=value per line), as
// every flag has its variable; --header wins over it.
func TestEmitHeadersFromTheEnvironment(t *testing.T) {
	schema := pgtest.Schema(t)
	db := []string{"--database-url", pgtest.URL(), "--schema", schema}
	out, code := ferryCmd(t, append([]string{"migrate", "up"}, db...)...)
	require.Equal(t, 0, code, out)
	t.Setenv("FERRY_EMIT_HEADERS", "tenant=acme\nregion=eu\n")
	out, code = ferryCmd(t, append([]string{"emit", "--topic", "orders", "--key", "k1", "--type", "OrderPlaced", "--data", "{}"}, db...)...)
	require.Equal(t, 0, code, out)
	out, code = ferryCmd(t, append([]string{"emit", "--topic", "orders", "--key", "k2", "--type", "OrderPlaced", "--data", "{}", "--header", "only=flag"}, db...)...)
	require.Equal(t, 0, code, out)
	headers := map[string]string{}
	rows, err := pgtest.Pool(t).Query(context.Background(), `SELECT key, headers::text FROM `+pgx.Identifier{schema, "outbox"}.Sanitize()+` ORDER BY key`)
	require.NoError(t, err)
	for rows.Next() {
		var k, h string
		require.NoError(t, rows.Scan(&k, &h))
		headers[k] = h
	}
	require.NoError(t, rows.Err())
	require.JSONEq(t, `{"tenant":"acme","region":"eu"}`, headers["k1"])
	require.JSONEq(t, `{"only":"flag"}`, headers["k2"], "--header wins over FERRY_EMIT_HEADERS")
	t.Setenv("FERRY_EMIT_HEADERS", "no-equals-sign")
	out, code = ferryCmd(t, append([]string{"emit", "--topic", "orders", "--key", "k3", "--type", "OrderPlaced", "--data", "{}"}, db...)...)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "FERRY_EMIT_HEADERS")
}

// A database that cannot be reached is one line, with the cause once (pgx
// repeats it per address and TLS mode tried).
func TestUnreachableDatabaseIsOneLine(t *testing.T) {
	t.Parallel()
	code, _, errOut := ferryBinary(t, "status", "--database-url", "postgres://postgres@127.0.0.1:1/none")
	require.Equal(t, 1, code, errOut)
	require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
	require.Equal(t, 1, strings.Count(errOut, "connection refused"), errOut)
	require.Contains(t, errOut, "cannot reach the database at --database-url / FERRY_DATABASE_URL")
}

// Relay settings are checked before the daemon touches anything, and the
// error names what the user typed: the flag, its variable, the file's key.
func TestRelaySettingsAreCheckedFirst(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch", "-1"}, "--batch / FERRY_BATCH_SIZE / relay.batch_size is -1: use 1 or more"},
		{[]string{"--batch", "0"}, "--batch / FERRY_BATCH_SIZE / relay.batch_size is 0: use 1 or more"},
		{[]string{"--poll-interval", "0s"}, "--poll-interval / FERRY_POLL_INTERVAL / relay.poll_interval is 0s"},
		{[]string{"--lease-ttl", "1ms"}, "--lease-ttl / FERRY_LEASE_TTL / relay.lease_ttl is 1ms: use 1s or more"},
		{[]string{"--dead-policy", "sometimes"}, `--dead-policy / FERRY_DEAD_POLICY / relay.dead_policy is "sometimes"`},
	} {
		// An unreachable database: were it opened first, the error would say so.
		args := append([]string{"relay", "--database-url", "postgres://postgres@127.0.0.1:1/none", "--nats-url", "nats://127.0.0.1:1"}, c.args...)
		code, _, errOut := ferryBinary(t, args...)
		require.Equal(t, 2, code, "ferry %v: %s", args, errOut)
		require.Contains(t, errOut, c.want, "ferry %v", args)
		require.NotContains(t, errOut, "RelayConfig", "ferry %v names Go fields", args)
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "ferry.yaml")
	require.NoError(t, os.WriteFile(config, []byte("relay:\n  batch_size: -3\n"), 0o600))
	code, _, errOut := ferryBinary(t, "run", "--config", config, "--data-dir", dir)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "relay.batch_size is -3")
	_, err := os.Stat(filepath.Join(dir, "ferry.db"))
	require.True(t, os.IsNotExist(err), "nothing was created or migrated before the refusal")
}

// `ferry tail` reads the embedded NATS server that `ferry run` started for
// its data directory, whatever port it took (4222 is taken here), and
// fetches without --count too.
func TestTailFindsTheEmbeddedServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	data := t.TempDir()
	en, err := startEmbeddedNATS(filepath.Join(data, "nats"), 0)
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			en.Close()
		}
	}()
	u, ok := embeddedURL(data)
	require.True(t, ok, "the URL is recorded")
	require.Equal(t, en.url, u)
	nc, err := nats.Connect(en.url)
	require.NoError(t, err)
	defer nc.Close()
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{CreateStream: true})
	require.NoError(t, err)
	evs := make([]*ferryevent.Event, 3)
	for i := range evs {
		evs[i] = &ferryevent.Event{Topic: "orders", Key: "k", Type: "OrderPlaced", Payload: []byte(`{}`)}
		require.NoError(t, ferryevent.Prepare(evs[i], i, 0, time.Now()))
	}
	for _, err := range sink.Publish(ctx, evs) {
		require.NoError(t, err)
	}
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"tail", "--data-dir", data, "--wait", "500ms"}, &out, &errOut), errOut.String())
	require.Equal(t, 3, strings.Count(out.String(), "OrderPlaced"), out.String())
	nc.Close()
	en.Close()
	closed = true
	_, ok = embeddedURL(data)
	require.False(t, ok, "the URL is removed when the server stops")
}

// An unknown nested key in ferry.yaml is named by its path, with the keys
// its section has, before anything is opened: not by the Go type behind
// it.
func TestUnknownNestedConfigKeyIsNamed(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ferry.yaml")
	require.NoError(t, os.WriteFile(path, []byte("database:\n  url: postgres://127.0.0.1:1/none\nrelay:\n  poll_intervall: 1s\n"), 0o600))
	code, _, errOut := ferryBinary(t, "run", "--config", path)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, `line 4: unknown key "relay.poll_intervall": the keys under relay are feed, holder, batch_size, poll_interval,`)
	require.NotContains(t, errOut, "struct {")
	require.NotContains(t, errOut, "connect", "nothing is opened before the configuration is checked")
}
