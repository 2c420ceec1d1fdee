package ferrymysql_test

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
)

// Ways commitCutter loses a COMMIT.
const (
	passCommits  = iota
	cutAfterSend // the server gets the COMMIT; its answer never reaches the client
	cutBefore    // the COMMIT never reaches the server
)

// commitCutter is a TCP proxy to the test server that, when armed, breaks
// the client's connection at its next COMMIT.
type commitCutter struct {
	ln     net.Listener
	target string
	mode   atomic.Int32
	wg     sync.WaitGroup
}

func newCommitCutter(t *testing.T, target string) *commitCutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := &commitCutter{ln: ln, target: target}
	c.wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			c.wg.Go(func() { c.serve(client) })
		}
	})
	t.Cleanup(func() { _ = ln.Close(); c.wg.Wait() })
	return c
}

func (c *commitCutter) serve(client net.Conn) {
	server, err := net.Dial("tcp", c.target)
	if err != nil {
		_ = client.Close()
		return
	}
	var mu sync.Mutex
	cut := false
	done := make(chan struct{})
	go func() { // server → client, dropped once cut
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			mu.Lock()
			dropped := cut
			if !dropped && n > 0 {
				_, _ = client.Write(buf[:n])
			}
			mu.Unlock()
			if err != nil || dropped {
				_ = client.Close()
				return
			}
		}
	}()
	defer func() { _ = server.Close(); <-done; _ = client.Close() }()
	head := make([]byte, 4)
	for {
		if _, err := io.ReadFull(client, head); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(append(head[:3:3], 0)))
		body := make([]byte, n)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		commit := n > 1 && body[0] == 0x03 && strings.EqualFold(strings.TrimSpace(string(body[1:])), "COMMIT")
		if commit {
			switch int(c.mode.Swap(passCommits)) {
			case cutAfterSend:
				mu.Lock()
				cut = true
				mu.Unlock()
				_, _ = server.Write(append(head, body...))
				<-done // the server answered (and the answer was dropped)
				return
			case cutBefore:
				return
			}
		}
		if _, err := server.Write(append(head, body...)); err != nil {
			return
		}
	}
}

// proxied opens a driver over a fresh migrated database, through a
// commitCutter, with a table of effects.
func proxied(t *testing.T) (*ferrymysql.Driver, *commitCutter) {
	dsn := mysqltest.Database(t)
	direct := mysqltest.Open(t, dsn, nil, true)
	_, err := direct.DB().Exec(`CREATE TABLE effects (n BIGINT AUTO_INCREMENT PRIMARY KEY, v VARBINARY(64) NOT NULL) ENGINE=InnoDB`)
	require.NoError(t, err)
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	cutter := newCommitCutter(t, cfg.Addr)
	cfg.Addr = cutter.ln.Addr().String()
	return mysqltest.Open(t, cfg.FormatDSN(), nil, false), cutter
}

func countEffects(t *testing.T, drv *ferrymysql.Driver, v string) int {
	t.Helper()
	var n int
	require.NoError(t, drv.DB().QueryRow(`SELECT COUNT(*) FROM effects WHERE v = ?`, v).Scan(&n))
	return n
}

// TestLostCommitIsResolvedByTheRequestRecord: RunTx never runs a
// transaction again blindly when its COMMIT's answer was lost. With a
// request ID it reads the record once the session has ended: a COMMIT
// that reached the server committed, and RunTx returns the callback's
// result without running it again; one that never reached it rolled back,
// and the callback runs again. Without a request ID nothing can tell, and
// RunTx says so (ferry.ErrCommitUnknown) without running it again.
func TestLostCommitIsResolvedByTheRequestRecord(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv, cutter := proxied(t)
	run := func(mode int32, requestID, v string) (string, int, error) {
		runs := 0
		cutter.mode.Store(mode)
		out, err := ferry.RunTx(ctx, drv, &ferry.TxOptions{RequestID: requestID, Input: v, RetryBase: time.Millisecond},
			func(ctx context.Context, tx *sql.Tx) (string, error) {
				runs++
				_, err := tx.ExecContext(ctx, `INSERT INTO effects (v) VALUES (?)`, v)
				return "done " + v, err
			})
		return out, runs, err
	}

	out, runs, err := run(cutAfterSend, "r-after", "after")
	require.NoError(t, err)
	require.Equal(t, "done after", out)
	require.Equal(t, 1, runs, "the COMMIT reached the server: the record says it committed")
	require.Equal(t, 1, countEffects(t, drv, "after"))

	out, runs, err = run(cutBefore, "r-before", "before")
	require.NoError(t, err)
	require.Equal(t, "done before", out)
	require.Equal(t, 2, runs, "the COMMIT never reached the server: no record, so the callback ran again")
	require.Equal(t, 1, countEffects(t, drv, "before"))

	_, runs, err = run(cutAfterSend, "", "blind")
	require.ErrorIs(t, err, ferry.ErrCommitUnknown)
	require.Equal(t, 1, runs, "never run again blindly")
	require.Equal(t, 1, countEffects(t, drv, "blind"), "it did commit")
}

// TestLockWaitTimeoutRunsTheWholeTransactionAgain: a lock wait timeout
// (1205) rolls back only its statement in InnoDB; RunTx rolls back the
// rest (an effect written before it) and runs the callback again, which
// then commits once. A deadlock is classified for a rerun too.
func TestLockWaitTimeoutRunsTheWholeTransactionAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv, _ := proxied(t)
	_, err := drv.DB().Exec(`CREATE TABLE hot (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB`)
	require.NoError(t, err)
	_, err = drv.DB().Exec(`INSERT INTO hot VALUES (1, 0), (2, 0)`)
	require.NoError(t, err)
	holder, err := drv.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback() }()
	_, err = holder.ExecContext(ctx, `UPDATE hot SET n = n + 1 WHERE id = 1`)
	require.NoError(t, err)
	runs := 0
	_, err = ferry.RunTx(ctx, drv, &ferry.TxOptions{RetryBase: time.Millisecond}, func(ctx context.Context, tx *sql.Tx) (int, error) {
		runs++
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (v) VALUES ('timed')`); err != nil {
			return 0, err
		}
		_, err := tx.ExecContext(ctx, `SET STATEMENT innodb_lock_wait_timeout = 1 FOR UPDATE hot SET n = n + 10 WHERE id = 1`)
		if runs == 1 {
			require.Equal(t, txdriver.ErrorInfo{Class: txdriver.Retry, Cause: "lock_wait_timeout"}, drv.ClassifyTxError(err))
			require.NoError(t, holder.Rollback())
		}
		return 0, err
	})
	require.NoError(t, err)
	require.Equal(t, 2, runs)
	require.Equal(t, 1, countEffects(t, drv, "timed"), "the first run's effect was rolled back with it")

	// A deadlock: each holds one row and wants the other's.
	a, err := drv.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = a.Rollback() }()
	b, err := drv.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = b.Rollback() }()
	_, err = a.ExecContext(ctx, `UPDATE hot SET n = n + 1 WHERE id = 1`)
	require.NoError(t, err)
	_, err = b.ExecContext(ctx, `UPDATE hot SET n = n + 1 WHERE id = 2`)
	require.NoError(t, err)
	errs := make(chan error, 2)
	go func() { _, err := a.ExecContext(ctx, `UPDATE hot SET n = n + 1 WHERE id = 2`); errs <- err }()
	go func() { _, err := b.ExecContext(ctx, `UPDATE hot SET n = n + 1 WHERE id = 1`); errs <- err }()
	var victim error
	for range 2 {
		if err := <-errs; err != nil {
			victim = err
			_ = a.Rollback()
			_ = b.Rollback()
		}
	}
	require.Equal(t, txdriver.ErrorInfo{Class: txdriver.Retry, Cause: "deadlock"}, drv.ClassifyTxError(victim))
	require.Equal(t, txdriver.Permanent, drv.ClassifyTxError(errors.New("the caller's own error")).Class)
}
