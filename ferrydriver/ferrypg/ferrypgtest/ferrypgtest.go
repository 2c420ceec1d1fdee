// Package ferrypgtest gives Ferry's tests a PostgreSQL pool and fresh schemas.
//
// The server comes from FERRY_TEST_PG_URL (default
// postgres://postgres@127.0.0.1:5432/test). When it cannot be reached the
// test is skipped with a message naming the variable, except under CI=true,
// where it fails.
package ferrypgtest

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferry-dev/ferry/ferryshared/testenv"
	"go.uber.org/goleak"
)

// DefaultURL is used when FERRY_TEST_PG_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns the test server's URL.
func URL() string {
	if u := os.Getenv("FERRY_TEST_PG_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var (
	once    sync.Once
	pool    *pgxpool.Pool
	poolErr error
)

// connect opens the shared pool once; poolErr says why it could not.
func connect() {
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cfg, err := pgxpool.ParseConfig(URL())
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 40
		pool, err = pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			err = pool.Ping(ctx)
		}
		poolErr = err
	})
}

// Pool returns a pool shared by the package's tests.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	connect()
	if poolErr != nil {
		testenv.Unavailable(t, "PostgreSQL", "FERRY_TEST_PG_URL", poolErr)
	}
	return pool
}

// Schema returns a fresh schema name, dropped when the test ends.
func Schema(t testing.TB) string {
	t.Helper()
	p := Pool(t)
	name := fmt.Sprintf("ferrytest_%d_%d", time.Now().UnixNano()%1e9, rand.IntN(1e6))
	t.Cleanup(func() {
		if os.Getenv("FERRY_TEST_KEEP_SCHEMA") != "" {
			t.Logf("keeping schema %s", name)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = p.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE")
	})
	return name
}

// Close closes the shared pool; call it from TestMain after the tests.
func Close() {
	if pool != nil {
		pool.Close()
	}
}

// Main runs a package's tests, closes the shared pool (and runs closers:
// other shared pools, mysqltest.Close) and fails the package if a test left
// goroutines behind (a relay that did not stop, a feed session that was
// not closed). Call it from TestMain.
//
// Testable examples cannot skip themselves: when the server cannot be
// reached (and CI is not "true"), Main skips them (-test.skip), saying so
// and naming the variable, as the tests that need the server skip.
func Main(m *testing.M, closers ...func()) {
	flag.Parse()
	if os.Getenv("CI") != "true" {
		if connect(); poolErr != nil {
			skip := "^Example"
			if f := flag.Lookup("test.skip"); f != nil && f.Value.String() != "" {
				skip = f.Value.String() + "|" + skip
			}
			_ = flag.Set("test.skip", skip)
			fmt.Fprintf(os.Stderr, "ferrypgtest: PostgreSQL is not reachable (%v): the examples, which need it, are skipped, as are the tests that do; set FERRY_TEST_PG_URL to a server to run them\n", poolErr)
		}
	}
	code := m.Run()
	Close()
	for _, c := range closers {
		c()
	}
	if code == 0 {
		// A driver's settlement listener stays up, idle, for a while after
		// its last caller (ferrypg's hubIdle): that one is meant to.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/ferry-dev/ferry/ferrydriver/ferrypg.(*settleHub).run")); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked by the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
