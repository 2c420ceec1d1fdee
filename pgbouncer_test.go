package ferry_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/ferry-dev/ferry/ferryshared/syncbuf"
	"github.com/ferry-dev/ferry/ferryshared/testenv"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// pgbouncerBinary finds PgBouncer: FERRY_TEST_PGBOUNCER, then PATH, then
// Debian's /usr/sbin/pgbouncer. Absent, the test is skipped (failed under
// CI=true) with a message saying what to install.
func pgbouncerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FERRY_TEST_PGBOUNCER"); p != "" {
		return p
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	testenv.Missing(t, "pgbouncer is not installed: install it (Debian: apt-get install pgbouncer) or set FERRY_TEST_PGBOUNCER to its path to run this test")
	return ""
}

// startPgBouncer runs a PgBouncer of its own in front of the test server,
// in transaction pooling mode on a free loopback port, until the test ends,
// and returns its URL (same user and database as the test server's).
func startPgBouncer(t *testing.T) string {
	t.Helper()
	bin := pgbouncerBinary(t)
	ferrypgtest.Pool(t) // skips when PostgreSQL is absent
	u, err := url.Parse(ferrypgtest.URL())
	require.NoError(t, err)
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	user := u.User.Username()
	db := u.Path[1:]
	dir, err := os.MkdirTemp("", "ferry-pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// PgBouncer refuses to run as root: it then switches to -u, who must
	// read the files.
	require.NoError(t, os.Chmod(dir, 0o755))
	auth := filepath.Join(dir, "userlist.txt")
	require.NoError(t, os.WriteFile(auth, []byte(strconv.Quote(user)+` ""`+"\n"), 0o644))
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		listen := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		ini := filepath.Join(dir, "pgbouncer.ini")
		require.NoError(t, os.WriteFile(ini, fmt.Appendf(nil, `[databases]
%s = host=%s port=%s dbname=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 200
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
`, db, host, port, db, user, listen, auth), 0o644))
		args := []string{ini}
		if os.Geteuid() == 0 {
			args = []string{"-u", "nobody", ini}
		}
		cmd := exec.Command(bin, args...)
		out := &syncbuf.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		require.NoError(t, cmd.Start())
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
		up := false
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
			select {
			case <-exited:
			default:
				if c, err := net.Dial("tcp", addr); err == nil {
					_ = c.Close()
					up = true
				}
			}
			if up {
				break
			}
			select {
			case <-exited:
				deadline = time.Time{}
			case <-time.After(50 * time.Millisecond):
			}
		}
		if !up {
			_ = cmd.Process.Kill()
			<-exited
			if attempt < 3 { // the port was taken meanwhile
				continue
			}
			t.Fatalf("pgbouncer did not listen on %s: %s", addr, out.String())
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
		return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", user, addr, db)
	}
}

// bouncerPool opens a pool on PgBouncer's URL with the extra query
// parameters (for example "default_query_exec_mode=cache_describe").
func bouncerPool(t *testing.T, bouncerURL, params string) *pgxpool.Pool {
	t.Helper()
	u := bouncerURL
	if params != "" {
		u += "&" + params
	}
	pool, err := pgxpool.New(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestPgBouncerTransactionPooling runs Ferry behind PgBouncer in
// transaction pooling mode, with the pool in each of pgx's modes that
// PgBouncer 1.18 can serve (no named prepared statements).
func TestPgBouncerTransactionPooling(t *testing.T) {
	bouncer := startPgBouncer(t)
	for _, mode := range []string{"cache_describe", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			pool := bouncerPool(t, bouncer, "default_query_exec_mode="+mode)
			schema := ferrypgtest.Schema(t)
			drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema})
			require.NoError(t, err)
			_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
			require.NoError(t, err, "migrations through PgBouncer")
			direct, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: schema})
			require.NoError(t, err)

			// Producers through PgBouncer: EmitTx in the caller's transaction.
			client, err := ferry.NewClient(drv, nil)
			require.NoError(t, err)
			var ids []uuid.UUID
			for i := range 40 {
				ev := &ferry.Event{Topic: "orders", Key: "k" + strconv.Itoa(i%4), Type: "T", Payload: []byte(strconv.Itoa(i))}
				if i%2 == 0 {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return client.EmitTx(ctx, tx, ev) })
				} else {
					ev2 := &ferry.Event{Topic: "orders", Key: "k9", Type: "T", Payload: []byte("x")}
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return client.EmitTx(ctx, tx, ev, ev2) })
					ids = append(ids, ev2.ID)
				}
				require.NoError(t, err, "EmitTx through PgBouncer (%s)", mode)
				ids = append(ids, ev.ID)
			}

			// The relay's feed needs one session: through PgBouncer it stops at start.
			bounced, err := ferry.NewRelay(drv, &memsink.Sink{}, &ferry.RelayConfig{Feed: "projector", PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second})
			require.NoError(t, err)
			rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
			err = bounced.Run(rctx)
			rcancel()
			require.ErrorIs(t, err, ferrydriver.ErrMisconfigured, "the relay through PgBouncer stops instead of retrying")
			require.ErrorContains(t, err, "session-pooled")

			// AwaitSettled LISTENs: through PgBouncer it fails at once.
			_, err = ferry.AwaitSettled(ctx, drv, "projector", ids, 30*time.Second)
			require.ErrorIs(t, err, ferrydriver.ErrMisconfigured)
			require.ErrorContains(t, err, "session-pooled")

			// A consumer through PgBouncer, fed by a relay on a direct URL. (The
			// checks above ran with no other client of PgBouncer: one that takes
			// the connection the session released can hide the pooling.)
			table := effects(t, direct)
			c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "projector", PollInterval: 20 * time.Millisecond})
			require.NoError(t, err)
			c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, key, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Key, ev.Seq)
				return err
			})
			startConsumer(t, c)

			// On a direct URL it delivers into the consumer behind PgBouncer.
			relay, err := ferry.NewRelay(direct, c.Sink(), &ferry.RelayConfig{Feed: "projector", PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second})
			require.NoError(t, err)
			run(t, relay)

			// AwaitSettled on a direct URL sees the consumer's work.
			st, err := ferry.AwaitSettled(ctx, direct, "projector", ids, 30*time.Second)
			require.NoError(t, err)
			require.ElementsMatch(t, ids, st.Settled)
			require.Equal(t, len(ids), count(t, `SELECT count(*) FROM `+table))
			require.Zero(t, count(t, `SELECT count(*) FROM (
				SELECT seq - lag(seq) OVER (PARTITION BY key ORDER BY n) AS step FROM `+table+`) s WHERE step <> 1`), "per-key order")
		})
	}
}

// TestPgBouncerStatementCache: with pgx's default statement cache, a pool
// behind a transaction-pooling PgBouncer finds its cached statements
// missing from, or already on, the server connection a transaction
// reached (SQLSTATE 26000, 42P05). The relay stops with ErrMisconfigured
// naming what to change, instead of retrying for ever.
func TestPgBouncerStatementCache(t *testing.T) {
	bouncer := startPgBouncer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	schema := ferrypgtest.Schema(t)
	direct, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	_, err = direct.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	drv, err := ferrypg.New(bouncerPool(t, bouncer, ""), &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	relay, err := ferry.NewRelay(drv, &memsink.Sink{}, &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	err = relay.Run(ctx)
	require.ErrorIs(t, err, ferrydriver.ErrMisconfigured, "the relay stops instead of retrying")
	require.ErrorContains(t, err, "session-pooled")
	require.NoError(t, ctx.Err(), "the relay stopped by itself")
}
