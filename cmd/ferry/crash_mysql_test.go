package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
)

// newMySQLFixture is a fresh database on the MariaDB with a row binlog
// that FERRY_TEST_MYSQL_URL names (default: the one .ci/mariadb starts),
// and a fresh stream.
func newMySQLFixture(t *testing.T) *fixture {
	nc := testNATS(t)
	dsn, url := mysqltest.DatabaseURL(t)
	drv := mysqltest.Open(t, dsn, nil, true)
	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	name := drv.Schema()
	f := &fixture{t: t, schema: name, stream: strings.ToUpper(name), prefix: name, store: drv,
		dbArgs: []string{"--database-url", url}}
	f.js, err = jetstream.New(nc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.js.DeleteStream(context.Background(), f.stream) })
	f.useJetStream()
	_, err = drv.DB().Exec(`CREATE TABLE business (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB`)
	require.NoError(t, err)
	f.emit = func(ctx context.Context, evs []*ferry.Event, hold time.Duration) error {
		// As an application's transaction runner does, a deadlock (two
		// producers creating keys in one gap at once) runs it again.
		for attempt := 0; ; attempt++ {
			err := emitMySQL(ctx, drv.DB(), client, evs, hold)
			var me *mysql.MySQLError
			if err == nil || attempt == 5 || !errors.As(err, &me) || me.Number != 1213 {
				return err
			}
		}
	}
	// A database-side fault: the server ends the binlog dump of every
	// replication connection, as a failover or a KILL would.
	f.terminateFeed = func(ctx context.Context) {
		admin := mysqltest.Admin(t)
		rows, err := admin.QueryContext(ctx, `SELECT id FROM information_schema.processlist WHERE command LIKE 'Binlog Dump%'`)
		require.NoError(t, err)
		var ids []int64
		for rows.Next() {
			var id int64
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		rows.Close()
		for _, id := range ids {
			_, _ = admin.ExecContext(ctx, "KILL CONNECTION ?", id) // it may have ended meanwhile
		}
	}
	return f
}

func emitMySQL(ctx context.Context, db *sql.DB, c *ferry.Client[*sql.Tx], evs []*ferry.Event, hold time.Duration) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	// A business write first: the transaction takes its id before its
	// events (a late committer when it holds on).
	if _, err := tx.ExecContext(ctx, `INSERT INTO business (v) VALUES (1)`); err != nil {
		return err
	}
	if err := c.EmitTx(ctx, tx, evs...); err != nil {
		return err
	}
	time.Sleep(hold)
	return tx.Commit()
}

// TestRelayCrashMySQL is TestRelayCrash on MariaDB: the relay reads the
// binlog, and is killed 20 times while producers emit (some transactions
// held open, to commit late), and the binlog dumps are ended from the
// server's side now and then.
func TestRelayCrashMySQL(t *testing.T) {
	t.Parallel()
	relayCrash(t, newMySQLFixture(t))
}

// TestZombieLeaderMySQL is TestZombieLeader on MariaDB.
func TestZombieLeaderMySQL(t *testing.T) {
	t.Parallel()
	zombieLeader(t, newMySQLFixture(t))
}

// TestRelayLogsTheMySQLFeedAsJSON: the MariaDB feed's own lines (a scan of
// the outbox, a purged binlog) go to the relay's logger, JSON lines among
// the relay's, not text from Go's default logger.
func TestRelayLogsTheMySQLFeedAsJSON(t *testing.T) {
	t.Parallel()
	f := newMySQLFixture(t)
	// A feed with no recorded binlog start scans the outbox, and says so.
	_, err := f.store.(*ferrymysql.Driver).DB().Exec(`UPDATE ferry_settings SET binlog_file = NULL, binlog_pos = NULL`)
	require.NoError(t, err)
	c := f.startRelay("h1")
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(c.logs.all(), func(l string) bool { return strings.Contains(l, "ferrymysql: the feed scans the outbox") })
	}, time.Minute, 50*time.Millisecond, "the feed's scan is logged")
	c.stop(t)
	for _, l := range c.logs.all() {
		var line map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &line), "every line is JSON: %s", l)
	}
}
