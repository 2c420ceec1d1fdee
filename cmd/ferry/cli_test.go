package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryshared/testenv"

	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// ferryBinary runs the built ferry binary and returns its exit status, stdout
// and stderr.
func ferryBinary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return ferryBinaryEnv(t, nil, args...)
}

// ferryBinaryEnv is ferryBinary with variables added to the environment.
func ferryBinaryEnv(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(ferryBin, args...)
	cmd.Env = append(os.Environ(), env...)
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
		// and each subcommand lists its own flags
		code, _, errOut := ferryBinary(t, command, subs[0], "-h")
		require.Equal(t, 0, code, "ferry %s %s -h: %s", command, subs[0], errOut)
		require.Contains(t, errOut, "Usage of ferry "+command+" "+subs[0]+":\n  -", "ferry %s %s -h lists its flags", command, subs[0])
		code, _, errOut = ferryBinary(t, command, "sideways")
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
	t.Parallel()
	schema := ferrypgtest.Schema(t)
	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	emit := func(env string, args ...string) (int, string) {
		code, out, errOut := ferryBinaryEnv(t, []string{"FERRY_EMIT_HEADERS=" + env},
			append(append([]string{"emit", "--topic", "orders", "--type", "OrderPlaced", "--data", "{}"}, db...), args...)...)
		return code, out + errOut
	}
	code, _, errOut := ferryBinary(t, append([]string{"migrate", "up"}, db...)...)
	require.Equal(t, 0, code, errOut)
	code, out := emit("tenant=acme\nregion=eu\n", "--key", "k1")
	require.Equal(t, 0, code, out)
	code, out = emit("tenant=acme\nregion=eu\n", "--key", "k2", "--header", "only=flag")
	require.Equal(t, 0, code, out)
	headers := map[string]string{}
	rows, err := ferrypgtest.Pool(t).Query(context.Background(), `SELECT key, headers::text FROM `+pgx.Identifier{schema, "outbox"}.Sanitize()+` ORDER BY key`)
	require.NoError(t, err)
	for rows.Next() {
		var k, h string
		require.NoError(t, rows.Scan(&k, &h))
		headers[k] = h
	}
	require.NoError(t, rows.Err())
	require.JSONEq(t, `{"tenant":"acme","region":"eu"}`, headers["k1"])
	require.JSONEq(t, `{"only":"flag"}`, headers["k2"], "--header wins over FERRY_EMIT_HEADERS")
	code, out = emit("no-equals-sign", "--key", "k3")
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
		{[]string{"--partition", "-1"}, "--partition / FERRY_PARTITION is -1: use 0 or more"},
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

// TestTailReadsWhatFerryRunPublished runs the binaries as a new user does:
// `ferry run` on the embedded defaults while port 4222 is taken (its NATS
// server moves to a free port), `ferry emit`, then `ferry tail`, which must
// read the server `ferry run` started, not the one on 4222, and fetch many
// messages per request (it asked for one at a time).
func TestTailReadsWhatFerryRunPublished(t *testing.T) {
	t.Parallel()
	if ln, err := net.Listen("tcp", "127.0.0.1:4222"); err == nil {
		t.Cleanup(func() { ln.Close() }) // taken, by this test if nothing else
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cfg := filepath.Join(dir, "ferry.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("data_dir: "+data+"\nrelay:\n  poll_interval: 50ms\nmetrics:\n  addr: \"off\"\n"), 0o600))
	daemon := exec.Command(ferryBin, "run", "--config", cfg)
	var logs syncbuf.Buffer
	daemon.Stderr = &logs
	require.NoError(t, daemon.Start())
	t.Cleanup(func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		_ = daemon.Wait()
	})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "ferry: relay is the leader") }, time.Minute, 20*time.Millisecond, "logs:\n%s", logs.String())
	url, ok := embeddedURL(data)
	require.True(t, ok, "ferry run records its NATS server's URL")
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	require.NotEqual(t, "4222", u.Port(), "4222 is taken: the embedded server moved (%s)", url)

	const events = 1200
	code, _, errOut := ferryBinary(t, "emit", "--data-dir", data, "--topic", "orders", "--key", "o-1", "--type", "OrderPlaced", "--data", `{}`, "--count", strconv.Itoa(events))
	require.Zero(t, code, errOut)
	nc := awaitStreamMsgs(t, url, ferrynats.DefaultStream, events, time.Minute)
	// Every pull request of a JetStream consumer is a message on this subject.
	var pulls atomic.Int64
	sub, err := nc.Subscribe("$JS.API.CONSUMER.MSG.NEXT.>", func(*nats.Msg) { pulls.Add(1) })
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	code, out, errOut := ferryBinary(t, "tail", "--data-dir", data, "--wait", "1s")
	require.Zero(t, code, errOut)
	require.Equal(t, events, strings.Count(out, "OrderPlaced"))
	require.NoError(t, nc.Flush())
	require.NoError(t, sub.Unsubscribe())
	t.Logf("ferry tail read %d events in %d pull requests", events, pulls.Load())
	require.LessOrEqual(t, pulls.Load(), int64(20), "tail fetches many messages per request")
}

// awaitStreamMsgs connects to the NATS server at url and waits until its
// stream holds want messages; it returns the connection (closed with the
// test).
func awaitStreamMsgs(t *testing.T, url, stream string, want uint64, within time.Duration) *nats.Conn {
	t.Helper()
	ctx := context.Background()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == want
	}, within, 20*time.Millisecond, "stream %s holds %d messages", stream, want)
	return nc
}

// Every command's -h names each flag's value by its type (Go's flag
// package takes a back-quoted word of a flag's help as the value's name:
// "-partitions ferry partitions show" read as nonsense), and every flag
// says its variable, but those typed each time.
func TestFlagHelpNamesValuesByType(t *testing.T) {
	t.Parallel()
	commands := [][]string{{"demo"}, {"run"}, {"relay"}, {"status"}, {"ui"}, {"emit"}, {"tail"}, {"version", "-h"}}
	for command, subs := range map[string][]string{
		"migrate": {"up", "down", "sql"}, "dlq": {"list", "show", "redrive", "discard"}, "partitions": {"show", "set"},
		"parked": {"list", "release", "skip"}, "chain": {"run", "status"}, "bench": {"drain", "latency", "consume", "settle", "ingest", "e2e"},
	} {
		for _, s := range subs {
			commands = append(commands, []string{command, s})
		}
	}
	flagLine := regexp.MustCompile(`^  -([a-z0-9-]+)(?: (.+))?$`)
	types := map[string]bool{"": true, "string": true, "int": true, "duration": true, "value": true, "float": true, "uint": true, "int64": true, "uint64": true}
	for _, c := range commands {
		if c[len(c)-1] == "-h" {
			continue // takes no flags
		}
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(context.Background(), append(c, "-h"), &out, &errOut), "ferry %v -h", c)
		flags := 0
		for _, line := range strings.Split(errOut.String(), "\n") {
			m := flagLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			flags++
			require.True(t, types[m[2]], "ferry %s -h: -%s is followed by %q, not a type", strings.Join(c, " "), m[1], m[2])
		}
		require.NotZero(t, flags, "ferry %s -h lists its flags:\n%s", strings.Join(c, " "), errOut.String())
		require.NotContains(t, errOut.String(), "`", "ferry %s -h", strings.Join(c, " "))
	}
}

// A mistake in a flag is one line: what is wrong, what the flag wants
// and where the flags are listed, not the whole usage.
func TestFlagMistakeIsOneLine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--poll-interval", "5"}, `invalid value "5" for flag -poll-interval: give a duration with its unit, such as 500ms, 2s or 1m (ferry relay -h lists the flags)`},
		{[]string{"status", "--bogus"}, "flag provided but not defined: -bogus (ferry status -h lists the flags)"},
		{[]string{"dlq", "list", "--limit", "many"}, `invalid value "many" for flag -limit: give a whole number (ferry dlq list -h lists the flags)`},
	} {
		code, out, errOut := ferryBinary(t, c.args...)
		require.Equal(t, 2, code, "%v: %s%s", c.args, out, errOut)
		require.Equal(t, "ferry "+c.args[0]+": "+c.want+"\n", errOut, "%v", c.args)
		require.Empty(t, out)
	}
}

// `ferry -h` names every kind of database --database-url takes.
func TestHelpNamesEveryDatabase(t *testing.T) {
	t.Parallel()
	code, out, _ := ferryBinary(t, "-h")
	require.Equal(t, 0, code)
	for _, scheme := range []string{"postgres://", "mongodb://", "mysql://", "sqlite:"} {
		require.Contains(t, out, scheme)
	}
}

// Errors of the webhook sink name the variables and flags that set what
// they are about, not only the Go fields.
func TestWebhookSettingsAreNamedAsTheCommandSetsThem(t *testing.T) {
	t.Parallel()
	db := []string{"--database-url", "sqlite:" + filepath.Join(t.TempDir(), "app.db"), "--metrics-addr", "off"}
	code, out, errOut := ferryBinaryEnv(t, []string{"FERRY_WEBHOOK_SECRETS=", "FERRY_WEBHOOK_UNSIGNED="}, append([]string{"relay", "--sink-url", "http://127.0.0.1:1/hook"}, db...)...)
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, errOut, "FERRY_WEBHOOK_SECRETS")
	require.Contains(t, errOut, "FERRY_WEBHOOK_UNSIGNED=true")
}

// `ferry migrate up` on a MariaDB that writes no binlog says so (it
// warned "... err=<nil>"), naming the settings the relay needs.
func TestMigrateOnAServerWithoutABinlogSaysSo(t *testing.T) {
	t.Parallel()
	url := "mysql://root@127.0.0.1:3306/"
	if u := os.Getenv("FERRY_TEST_MYSQL_NOBINLOG_URL"); u != "" {
		url = u
	}
	dsn, err := ferrymysql.DSNFromURL(url)
	require.NoError(t, err)
	admin, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	defer admin.Close()
	var logBin int
	if err := admin.QueryRow(`SELECT @@log_bin`).Scan(&logBin); err != nil {
		testenv.Unavailable(t, "MariaDB without a binlog", "FERRY_TEST_MYSQL_NOBINLOG_URL", err)
	}
	require.Zero(t, logBin, "the server at %s writes a binlog: set FERRY_TEST_MYSQL_NOBINLOG_URL to one that does not", url)
	name := "ferry_nobinlog_cli_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	_, err = admin.Exec(`CREATE DATABASE ` + name)
	require.NoError(t, err)
	defer func() { _, _ = admin.Exec(`DROP DATABASE ` + name) }()
	code, out, errOut := ferryBinary(t, "migrate", "up", "--database-url", strings.TrimSuffix(url, "/")+"/"+name)
	require.Equal(t, 0, code, out+errOut)
	require.Contains(t, errOut, "the server writes no binlog (log_bin is off)")
	require.Contains(t, errOut, "binlog_format=ROW")
	require.NotContains(t, errOut, "err=<nil>")
}

// TestMigrateDryRunSaysWhatWouldBe: a dry run changes nothing and says so,
// rather than that the schema "is at" a version it is not at.
func TestMigrateDryRunSaysWhatWouldBe(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "app.db")
	code, out, errOut := ferryBinary(t, "migrate", "up", "--dry-run", "--database-url", url)
	require.Equal(t, 0, code, out+errOut)
	require.Contains(t, out, "would be at version")
	require.Contains(t, out, "nothing was changed")
	require.NotContains(t, out, " is at version")
	code, out, errOut = ferryBinary(t, "migrate", "up", "--database-url", url)
	require.Equal(t, 0, code, out+errOut)
	require.Contains(t, out, " is at version")
}
