// Package mysqltest gives Ferry's tests a MariaDB server that writes a
// row binlog, and a fresh database on it per test.
//
// The server comes from FERRY_TEST_MYSQL_URL (default
// mysql://root@127.0.0.1:3307/, the private server `.ci/services` and
// `.ci/mariadb` start with the binlog settings the feed needs). When it
// cannot be reached the test is skipped with a message naming the
// variable, except under CI=true, where it fails.
package mysqltest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryshared/testenv"

	"github.com/go-sql-driver/mysql"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
)

// DefaultURL is used when FERRY_TEST_MYSQL_URL is unset.
const DefaultURL = "mysql://root@127.0.0.1:3307/"

// URL returns the test server's URL.
func URL() string {
	if u := os.Getenv("FERRY_TEST_MYSQL_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var (
	once    sync.Once
	admin   *sql.DB
	baseDSN *mysql.Config
	openErr error
)

func connect() {
	once.Do(func() {
		dsn, err := ferrymysql.DSNFromURL(URL())
		if err != nil {
			openErr = err
			return
		}
		if baseDSN, openErr = mysql.ParseDSN(dsn); openErr != nil {
			return
		}
		admin, openErr = sql.Open("mysql", dsn)
		if openErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		openErr = admin.PingContext(ctx)
	})
}

// Close closes the shared admin pool, if one was opened: call it after a
// package's tests (ferrypgtest.Main(m, mysqltest.Close)), before a check for
// leaked goroutines.
func Close() {
	if admin != nil {
		_ = admin.Close()
	}
}

// Admin returns a pool on the server with no database chosen.
func Admin(t testing.TB) *sql.DB {
	t.Helper()
	connect()
	if openErr != nil {
		testenv.Unavailable(t, "MariaDB (with a row binlog)", "FERRY_TEST_MYSQL_URL", openErr)
	}
	return admin
}

// Database creates a fresh database, dropped when the test ends, and
// returns its DSN.
func Database(t testing.TB) string {
	t.Helper()
	dsn, _ := database(t)
	return dsn
}

// DatabaseURL is Database, and the database's mysql:// URL (for `ferry
// --database-url`).
func DatabaseURL(t testing.TB) (dsn, url string) {
	t.Helper()
	dsn, name := database(t)
	u := URL()
	if i := strings.Index(u, "://"); i >= 0 {
		if j := strings.Index(u[i+3:], "/"); j >= 0 {
			rest := u[i+3+j+1:]
			query := ""
			if q := strings.Index(rest, "?"); q >= 0 {
				query = rest[q:]
			}
			return dsn, u[:i+3+j+1] + name + query
		}
		return dsn, u + "/" + name
	}
	return dsn, u
}

func database(t testing.TB) (dsn, name string) {
	t.Helper()
	db := Admin(t)
	name = fmt.Sprintf("ferry_t%d_%08x", time.Now().Unix()%100000, rand.Uint32())
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("mysqltest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec("DROP DATABASE IF EXISTS " + name); err != nil {
			t.Errorf("mysqltest: drop database %s: %v", name, err)
		}
	})
	c := baseDSN.Clone()
	c.DBName = name
	return c.FormatDSN(), name
}

// Driver opens a driver over a fresh, migrated database (cfg may be nil),
// closed when the test ends.
func Driver(t testing.TB, cfg *ferrymysql.Config) *ferrymysql.Driver {
	t.Helper()
	return Open(t, Database(t), cfg, true)
}

// Open opens a driver over dsn, closed when the test ends; migrate
// creates Ferry's tables.
func Open(t testing.TB, dsn string, cfg *ferrymysql.Config, migrate bool) *ferrymysql.Driver {
	t.Helper()
	drv, err := ferrymysql.Open(dsn, cfg)
	if err != nil {
		t.Fatalf("mysqltest: open %s: %v", dsn, err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	if migrate {
		if _, err := drv.Migrate(context.Background(), &ferrydriver.MigrateParams{}); err != nil {
			t.Fatalf("mysqltest: migrate: %v", err)
		}
	}
	return drv
}
