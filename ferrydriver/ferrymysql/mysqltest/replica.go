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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryshared/testenv"

	"github.com/go-sql-driver/mysql"
)

// Server is a MariaDB server of a test's own, with the binlog settings
// the feed needs, killed when the test ends: for tests of a replication
// topology (a failover), which the shared test server cannot be part of.
type Server struct {
	// Addr is its host:port.
	Addr string
	// Admin is a pool on it with no database chosen.
	Admin *sql.DB
}

// DSN is the DSN of database db on s.
func (s *Server) DSN(db string) string {
	c := mysql.NewConfig()
	c.Net, c.Addr, c.User, c.DBName = "tcp", s.Addr, "root", db
	return c.FormatDSN()
}

// StartServer starts a server with an empty data directory and the
// given server_id; its binlog files are binlog-<server_id>.NNNNNN. It needs mariadbd and mariadb-install-db; without them
// the test is skipped (fails under CI=true).
func StartServer(t testing.TB, serverID int, args ...string) *Server {
	t.Helper()
	server, err := lookPath("mariadbd", "/usr/sbin/mariadbd")
	if err != nil {
		testenv.Unavailable(t, "mariadbd (a server of the test's own)", "PATH", err)
	}
	install, err := lookPath("mariadb-install-db", "/usr/bin/mariadb-install-db")
	if err != nil {
		testenv.Unavailable(t, "mariadb-install-db (a server of the test's own)", "PATH", err)
	}
	dir, err := os.MkdirTemp("", "ferry-mariadb-")
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
	cmd := exec.Command(server, append([]string{"--no-defaults", "--datadir=" + data, "--port=" + port, "--bind-address=127.0.0.1",
		"--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "pid"), "--log-error=" + filepath.Join(dir, "err.log"),
		"--server-id=" + strconv.Itoa(serverID), "--log-bin=" + filepath.Join(data, "binlog-"+strconv.Itoa(serverID)), "--binlog-format=ROW",
		"--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
		"--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M", "--skip-name-resolve"}, args...)...)
	if os.Getuid() == 0 {
		cmd.Args = append(cmd.Args, "--user=root")
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("mysqltest: start mariadbd: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	s := &Server{Addr: "127.0.0.1:" + port}
	s.Admin, err = sql.Open("mysql", s.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for s.Admin.PingContext(ctx) != nil {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "err.log"))
			t.Fatalf("mysqltest: mariadbd exited; its log:\n%s", log)
		case <-ctx.Done():
			t.Fatalf("mysqltest: mariadbd did not answer within 2 minutes")
		case <-time.After(100 * time.Millisecond):
		}
	}
	return s
}

// StartReplica starts a server (server_id 2) that replicates all of
// primary by GTID from its first transaction and logs what it applies
// (log_slave_updates): the replica a failover promotes. As a replica in
// service would, it has written a transaction of its own first (in a GTID
// domain of its own, 9), so that its binlog's offsets are not the
// primary's.
func StartReplica(t testing.TB, primary *Server) *Server {
	t.Helper()
	r := StartServer(t, 2, "--log-slave-updates")
	host, port, err := net.SplitHostPort(primary.Addr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := r.Admin.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{
		"SET SESSION gtid_domain_id = 9",
		"CREATE DATABASE replica_local",
		"CREATE TABLE replica_local.heartbeat (id INT PRIMARY KEY, at DATETIME(6)) ENGINE=InnoDB",
		"INSERT INTO replica_local.heartbeat VALUES (1, NOW(6))",
		"SET SESSION gtid_domain_id = DEFAULT",
	} {
		if _, err := conn.ExecContext(context.Background(), q); err != nil {
			t.Fatalf("mysqltest: replica: %s: %v", q, err)
		}
	}
	for _, q := range []string{
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '%s', MASTER_PORT = %s, MASTER_USER = 'root', MASTER_USE_GTID = slave_pos", host, port),
		"START SLAVE",
	} {
		if _, err := r.Admin.Exec(q); err != nil {
			t.Fatalf("mysqltest: replica: %s: %v", q, err)
		}
	}
	return r
}

// CatchUp waits until replica r applied everything primary committed so
// far.
func (r *Server) CatchUp(t testing.TB, primary *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pos string
	if err := primary.Admin.QueryRowContext(ctx, `SELECT @@gtid_binlog_pos`).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	var res sql.NullInt64
	if err := r.Admin.QueryRowContext(ctx, `SELECT MASTER_GTID_WAIT(?, 50)`, pos).Scan(&res); err != nil {
		t.Fatal(err)
	}
	if !res.Valid || res.Int64 != 0 {
		var state string
		_ = r.Admin.QueryRowContext(ctx, `SELECT @@gtid_slave_pos`).Scan(&state)
		t.Fatalf("mysqltest: the replica did not reach %s within 50 s (it is at %s): %s", pos, state, r.slaveErrors(ctx))
	}
}

func (r *Server) slaveErrors(ctx context.Context) string {
	rows, err := r.Admin.QueryContext(ctx, `SHOW SLAVE STATUS`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	var errs []string
	if rows.Next() && rows.Scan(ptrs...) == nil {
		for i, c := range cols {
			if strings.HasPrefix(c, "Last_") && strings.HasSuffix(c, "Error") && vals[i].String != "" {
				errs = append(errs, c+": "+vals[i].String)
			}
		}
	}
	return strings.Join(errs, "; ")
}

// Promote stops replication: the replica is a primary of its own, as a
// failover leaves it.
func (r *Server) Promote(t testing.TB) {
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
