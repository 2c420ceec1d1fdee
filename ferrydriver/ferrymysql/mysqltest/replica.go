package mysqltest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/internal/pgtest"
)

// Replica is a MariaDB server of a test's own that replicates one
// database of the test server by GTID and logs what it applies
// (log_slave_updates), with the binlog settings the feed needs: the
// replica a failover promotes.
type Replica struct {
	// DSN is the replicated database's DSN on the replica.
	DSN string
	// Admin is a pool on the replica with no database chosen.
	Admin *sql.DB
}

// StartReplica starts a replica of database name (which must be empty:
// what the test writes to it after this call is replicated), stopped when
// the test ends. It needs mariadbd and mariadb-install-db; without them
// the test is skipped (fails under CI=true).
func StartReplica(t testing.TB, name string) *Replica {
	t.Helper()
	primary := Admin(t)
	server, err := lookPath("mariadbd", "/usr/sbin/mariadbd")
	if err != nil {
		pgtest.Unavailable(t, "mariadbd (for a replica)", "PATH", err)
	}
	install, err := lookPath("mariadb-install-db", "/usr/bin/mariadb-install-db")
	if err != nil {
		pgtest.Unavailable(t, "mariadb-install-db (for a replica)", "PATH", err)
	}
	dir, err := os.MkdirTemp("", "ferry-replica-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	if out, err := exec.Command(install, "--no-defaults", "--datadir="+data, "--auth-root-authentication-method=normal",
		"--skip-test-db").CombinedOutput(); err != nil {
		t.Fatalf("mysqltest: mariadb-install-db: %v\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(server, "--no-defaults", "--datadir="+data, "--port="+port, "--bind-address=127.0.0.1",
		"--socket="+filepath.Join(dir, "sock"), "--pid-file="+filepath.Join(dir, "pid"), "--log-error="+filepath.Join(dir, "err.log"),
		"--server-id=2", "--log-bin="+filepath.Join(data, "binlog"), "--log-slave-updates", "--binlog-format=ROW",
		"--binlog-row-image=FULL", "--binlog-row-metadata=FULL", "--replicate-do-db="+name,
		"--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M", "--skip-name-resolve")
	if os.Getuid() == 0 {
		cmd.Args = append(cmd.Args, "--user=root")
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("mysqltest: start the replica: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	c := baseDSN.Clone()
	c.Addr, c.User, c.Passwd, c.DBName = "127.0.0.1:"+port, "root", "", ""
	admin, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for admin.PingContext(ctx) != nil {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "err.log"))
			t.Fatalf("mysqltest: the replica exited; its log:\n%s", log)
		case <-ctx.Done():
			t.Fatalf("mysqltest: the replica did not answer within 2 minutes")
		case <-time.After(100 * time.Millisecond):
		}
	}

	// From the test server's present position: only what comes next.
	var pos string
	if err := primary.QueryRowContext(ctx, `SELECT @@gtid_binlog_pos`).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	host, pport, err := net.SplitHostPort(baseDSN.Addr)
	if err != nil {
		t.Fatalf("mysqltest: the test server's address %q: %v", baseDSN.Addr, err)
	}
	for _, q := range []string{
		"CREATE DATABASE " + name,
		"SET GLOBAL gtid_slave_pos = '" + pos + "'",
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '%s', MASTER_PORT = %s, MASTER_USER = '%s', MASTER_PASSWORD = '%s', MASTER_USE_GTID = slave_pos",
			host, pport, quote(baseDSN.User), quote(baseDSN.Passwd)),
		"START SLAVE",
	} {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			t.Fatalf("mysqltest: replica: %s: %v", strings.SplitN(q, " =", 2)[0], err)
		}
	}
	c.DBName = name
	return &Replica{DSN: c.FormatDSN(), Admin: admin}
}

// CatchUp waits until the replica applied everything the test server
// committed so far.
func (r *Replica) CatchUp(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pos string
	if err := Admin(t).QueryRowContext(ctx, `SELECT @@gtid_binlog_pos`).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	var res sql.NullInt64
	if err := r.Admin.QueryRowContext(ctx, `SELECT MASTER_GTID_WAIT(?, 50)`, pos).Scan(&res); err != nil {
		t.Fatal(err)
	}
	if !res.Valid || res.Int64 != 0 {
		var state, errText string
		_ = r.Admin.QueryRowContext(ctx, `SELECT @@gtid_slave_pos`).Scan(&state)
		rows, err := r.Admin.QueryContext(ctx, `SHOW SLAVE STATUS`)
		if err == nil {
			cols, _ := rows.Columns()
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if rows.Next() && rows.Scan(ptrs...) == nil {
				for i, c := range cols {
					if strings.HasPrefix(c, "Last_") && strings.HasSuffix(c, "Error") && vals[i].String != "" {
						errText += c + ": " + vals[i].String + "; "
					}
				}
			}
			rows.Close()
		}
		t.Fatalf("mysqltest: the replica did not reach %s within 50 s (it is at %s; %s)", pos, state, errText)
	}
}

// Promote stops replication: the replica is a primary of its own, as a
// failover leaves it.
func (r *Replica) Promote(t testing.TB) {
	t.Helper()
	for _, q := range []string{"STOP SLAVE", "RESET SLAVE ALL"} {
		if _, err := r.Admin.Exec(q); err != nil {
			t.Fatalf("mysqltest: promote the replica: %s: %v", q, err)
		}
	}
}

func lookPath(name, fallback string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if _, err := os.Stat(fallback); err == nil {
		return fallback, nil
	}
	return "", errors.New(name + " is not installed (apt-get install mariadb-server)")
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}

func quote(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `'`, `\'`) }
