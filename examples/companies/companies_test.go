package companies_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/examples/companies"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { ferrypgtest.Main(m, mysqltest.Close) }

// retryLog counts RunTx's retry lines by cause.
type retryLog struct {
	mu     sync.Mutex
	causes map[string]int
}

func (r *retryLog) Enabled(context.Context, slog.Level) bool { return true }
func (r *retryLog) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *retryLog) WithGroup(string) slog.Handler            { return r }
func (r *retryLog) Handle(_ context.Context, rec slog.Record) error {
	if !strings.Contains(rec.Message, "running it again") && !strings.Contains(rec.Message, "resolved the outcome") {
		return nil
	}
	cause := "commit_resolved"
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "cause" {
			cause = a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.causes[cause]++
	return nil
}

func (r *retryLog) total() int {
	n := 0
	for _, v := range r.snapshot() {
		n += v
	}
	return n
}

func (r *retryLog) snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.causes {
		out[k] = v
	}
	return out
}

// env is one backend with the service on it.
type env struct {
	name    string
	app     *companies.App
	drv     companies.Backend
	db      *sql.DB // for the checks
	outbox  string  // the outbox table
	retries *retryLog
	// reopen builds a new App on new connections, as a restarted process.
	reopen func(t *testing.T) *companies.App
	// armCommitDrop makes the next COMMIT's answer get lost (PostgreSQL
	// and MySQL).
	armCommitDrop func()
}

// dropConn closes the connection right after sending a COMMIT when armed:
// the server commits, the client never hears it.
type dropConn struct {
	net.Conn
	armed    *atomic.Bool
	isCommit func(b []byte) bool
}

func (c *dropConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err == nil && c.isCommit(b) && c.armed.CompareAndSwap(true, false) {
		_ = c.Conn.Close()
	}
	return n, err
}

func postgresEnv(t *testing.T) *env {
	ferrypgtest.Pool(t) // skip, or fail under CI=true, without a server
	schema := ferrypgtest.Schema(t)
	armed := &atomic.Bool{}
	open := func(t *testing.T) (*sql.DB, companies.Backend) {
		cfg, err := pgx.ParseConfig(ferrypgtest.URL())
		require.NoError(t, err)
		cfg.RuntimeParams["search_path"] = schema
		dial := cfg.DialFunc
		cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &dropConn{Conn: c, armed: armed, isCommit: func(b []byte) bool { return bytes.Contains(bytes.ToLower(b), []byte("commit")) }}, nil
		}
		db := stdlib.OpenDB(*cfg)
		db.SetMaxOpenConns(40)
		t.Cleanup(func() { _ = db.Close() })
		drv, err := ferrypg.NewSQL(db, &ferrypg.Config{Schema: schema, TxIsolation: ferrypg.RepeatableRead})
		require.NoError(t, err)
		return db, drv
	}
	db, drv := open(t)
	_, err := drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	e := &env{name: "postgres", drv: drv, db: db, outbox: schema + ".outbox", retries: &retryLog{causes: map[string]int{}}}
	e.app = newApp(t, drv, db, e.retries)
	e.reopen = func(t *testing.T) *companies.App {
		db, drv := open(t)
		return newApp(t, drv, db, e.retries)
	}
	e.armCommitDrop = func() { armed.Store(true) }
	return e
}

// mysqlNets numbers the networks registered with go-sql-driver/mysql, one
// per environment (its dial function arms that environment's drops).
var mysqlNets atomic.Int64

// mysqlEnv is the service on a fresh database of the MariaDB server that
// FERRY_TEST_MYSQL_URL names (default: the one .ci/mariadb starts), at
// InnoDB's default REPEATABLE READ.
func mysqlEnv(t *testing.T) *env {
	dsn := mysqltest.Database(t) // skip, or fail under CI=true, without a server
	armed := &atomic.Bool{}
	network := fmt.Sprintf("companies-%d", mysqlNets.Add(1))
	mysql.RegisterDialContext(network, func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		// A COM_QUERY packet (0x03) of the text COMMIT, as database/sql's
		// Commit sends it.
		return &dropConn{Conn: c, armed: armed, isCommit: func(b []byte) bool { return bytes.HasSuffix(b, []byte("\x03COMMIT")) }}, nil
	})
	open := func(t *testing.T) (*sql.DB, companies.Backend) {
		cfg, err := mysql.ParseDSN(dsn)
		require.NoError(t, err)
		cfg.Net = network
		drv, err := ferrymysql.Open(cfg.FormatDSN(), nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = drv.Close() })
		drv.DB().SetMaxOpenConns(40)
		return drv.DB(), drv
	}
	db, drv := open(t)
	_, err := drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	e := &env{name: "mysql", drv: drv, db: db, outbox: "ferry_outbox", retries: &retryLog{causes: map[string]int{}}}
	e.app = newApp(t, drv, db, e.retries)
	e.reopen = func(t *testing.T) *companies.App {
		db, drv := open(t)
		return newApp(t, drv, db, e.retries)
	}
	e.armCommitDrop = func() { armed.Store(true) }
	return e
}

func sqliteEnv(t *testing.T) *env {
	path := filepath.Join(t.TempDir(), "companies.db")
	open := func(t *testing.T) *ferrysqlite.Driver {
		drv, err := ferrysqlite.Open(path, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = drv.Close() })
		return drv
	}
	drv := open(t)
	_, err := drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	e := &env{name: "sqlite", drv: drv, db: drv.ReadDB(), outbox: "ferry_outbox", retries: &retryLog{causes: map[string]int{}}}
	e.app = newApp(t, drv, drv.DB(), e.retries)
	e.reopen = func(t *testing.T) *companies.App {
		d := open(t)
		return newApp(t, d, d.DB(), e.retries)
	}
	return e
}

func newApp(t *testing.T, drv companies.Backend, db *sql.DB, retries *retryLog) *companies.App {
	app, err := companies.New(drv, db, slog.New(retries))
	require.NoError(t, err)
	require.NoError(t, app.Migrate(context.Background()))
	return app
}

// eachBackend runs f on PostgreSQL, MySQL and SQLite.
func eachBackend(t *testing.T, f func(t *testing.T, e *env)) {
	t.Run("postgres", func(t *testing.T) { t.Parallel(); f(t, postgresEnv(t)) })
	t.Run("mysql", func(t *testing.T) { t.Parallel(); f(t, mysqlEnv(t)) })
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); f(t, sqliteEnv(t)) })
}

func count(t *testing.T, e *env, q string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, e.db.QueryRow(q).Scan(&n), q)
	return n
}

// checkInvariants: one company per key, no duplicate membership, each
// company's counter equal to its real membership count, display numbers
// without gaps (the sequence moves only in committed transactions), one
// MembershipLinked event per membership, and every request's stored result
// equal to what its callers got.
func checkInvariants(t *testing.T, e *env, results map[string]companies.LinkResult) {
	t.Helper()
	checkInvariantsGaps(t, e, results, false)
}

func checkInvariantsGaps(t *testing.T, e *env, results map[string]companies.LinkResult, gapsAllowed bool) {
	t.Helper()
	companiesN := count(t, e, `SELECT count(*) FROM companies`)
	require.Equal(t, companiesN, count(t, e, `SELECT count(DISTINCT canonical_key) FROM companies`), "one company per key")
	memberships := count(t, e, `SELECT count(*) FROM memberships`)
	require.Equal(t, memberships, count(t, e, `SELECT count(*) FROM (SELECT DISTINCT company_id, member_id FROM memberships) d`), "no duplicate membership")
	require.Zero(t, count(t, e, `SELECT count(*) FROM companies c WHERE member_count <> (SELECT count(*) FROM memberships m WHERE m.company_id = c.id)`),
		"every counter equals the real membership count")
	if companiesN > 0 && !gapsAllowed {
		require.Equal(t, companiesN, count(t, e, `SELECT max(display_number) FROM companies`), "display numbers 1..N, no gaps")
	}
	require.Equal(t, memberships, count(t, e, `SELECT count(*) FROM `+e.outbox+` WHERE type = 'MembershipLinked'`), "one event per membership")
	for id, want := range results {
		rec, err := e.drv.GetRequest(context.Background(), id)
		require.NoError(t, err, "request %s has a record", id)
		var got companies.LinkResult
		require.NoError(t, jsonUnmarshal(rec.Result, &got))
		require.Equal(t, want, got, "request %s: the stored result is what its caller got", id)
	}
}

// TestSameCompanyDifferentRequests: 32 requests, each with its own ID and
// member, name the same company in different spellings at once: one
// company, 32 memberships.
func TestSameCompanyDifferentRequests(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		spellings := []string{"Acme Inc.", "ACME, INC", "acme", "Acme Incorporated", "  acme   co "}
		results := runConcurrently(t, 32, func(i int) (string, companies.LinkResult, error) {
			id := fmt.Sprintf("same-%d", i)
			res, err := e.app.LinkCompany(ctx, id, companies.LinkInput{CompanyName: spellings[i%len(spellings)], MemberID: "m" + strconv.Itoa(i), Role: "member"})
			return id, res, err
		})
		require.Len(t, results, 32)
		created := 0
		for _, r := range results {
			if r.CompanyCreated {
				created++
			}
		}
		require.Equal(t, 1, created, "one request created the company")
		require.EqualValues(t, 1, count(t, e, `SELECT count(*) FROM companies`))
		require.EqualValues(t, 32, count(t, e, `SELECT member_count FROM companies`))
		checkInvariants(t, e, results)
		t.Logf("%s: retries %v", e.name, e.retries.snapshot())
	})
}

// TestResentRequest: the same request sent 16 times at once and again
// later returns one result and has one effect; the same ID with another
// input is refused.
func TestResentRequest(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		in := companies.LinkInput{CompanyName: "Globex", BusinessNumber: "123-45-67890", MemberID: "alice", Role: "owner"}
		got := make([]companies.LinkResult, 16)
		var wg sync.WaitGroup
		for i := range got {
			wg.Go(func() {
				res, err := e.app.LinkCompany(ctx, "req-1", in)
				if err != nil {
					t.Errorf("send %d: %v", i, err)
				}
				got[i] = res
			})
		}
		wg.Wait()
		for i := range got {
			require.Equal(t, got[0], got[i], "send %d got another result", i)
		}
		require.True(t, got[0].CompanyCreated)
		require.True(t, got[0].MembershipCreated)
		again, err := e.app.LinkCompany(ctx, "req-1", in)
		require.NoError(t, err)
		require.Equal(t, got[0], again, "a later resend returns the stored result")
		require.EqualValues(t, 1, count(t, e, `SELECT count(*) FROM memberships`))

		other := in
		other.MemberID = "mallory"
		_, err = e.app.LinkCompany(ctx, "req-1", other)
		var conflict *ferry.RequestConflictError
		require.ErrorAs(t, err, &conflict)
		require.Equal(t, "req-1", conflict.RequestID)
		require.EqualValues(t, 1, count(t, e, `SELECT count(*) FROM memberships`), "the conflicting request had no effect")
		checkInvariants(t, e, map[string]companies.LinkResult{"req-1": got[0]})
	})
}

// TestDifferentCompaniesShareTheSequence: 32 requests for 32 different
// companies all write the shared sequence row. On PostgreSQL (REPEATABLE
// READ) the losers get serialization failures and RunTx reruns them; all
// succeed, with display numbers 1..32.
func TestDifferentCompaniesShareTheSequence(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		results := runConcurrently(t, 32, func(i int) (string, companies.LinkResult, error) {
			id := fmt.Sprintf("co-%d", i)
			res, err := e.app.LinkCompany(ctx, id, companies.LinkInput{CompanyName: fmt.Sprintf("Company %d", i), MemberID: "founder", Role: "owner"})
			return id, res, err
		})
		require.Len(t, results, 32)
		var numbers []int
		for _, r := range results {
			numbers = append(numbers, int(r.DisplayNumber))
		}
		sort.Ints(numbers)
		for i, n := range numbers {
			require.Equal(t, i+1, n)
		}
		checkInvariants(t, e, results)
		retries := e.retries.snapshot()
		t.Logf("%s: retries by cause %v", e.name, retries)
		switch e.name {
		case "postgres":
			require.Positive(t, retries["serialization_failure"], "the shared row made transactions conflict and rerun")
		case "mysql":
			// The sequence row queues writers; the business keys' gap
			// locks make some of them deadlock, each rerun by RunTx. How
			// many depends on the interleaving: the numbers above are the
			// check.
			require.Zero(t, retries["serialization_failure"])
		default:
			t.Log("sqlite: one writer at a time, so transactions queue instead of conflicting: no retries to count")
		}
	})
}

// TestCommitAnswerLost (PostgreSQL, MySQL): the connection breaks right
// after COMMIT is sent. RunTx does not run the request again: it asks the
// database whether the transaction committed (PostgreSQL: the
// transaction's status; MySQL: the request record, once the session that
// sent the COMMIT has ended) and returns the result. A resend from a
// restarted process gets the stored result; the effect exists once.
func TestCommitAnswerLost(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) *env{"postgres": postgresEnv, "mysql": mysqlEnv} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := open(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			in := companies.LinkInput{CompanyName: "Initech", BusinessNumber: "98765-4321", MemberID: "peter", Role: "member"}
			before := e.retries.snapshot()["commit_resolved"]
			e.armCommitDrop()
			res, err := e.app.LinkCompany(ctx, "lost-1", in)
			require.NoError(t, err)
			require.True(t, res.CompanyCreated)
			require.True(t, res.MembershipCreated)
			require.Equal(t, before+1, e.retries.snapshot()["commit_resolved"], "the outcome was resolved, not guessed")

			restarted := e.reopen(t)
			again, err := restarted.LinkCompany(ctx, "lost-1", in)
			require.NoError(t, err)
			require.Equal(t, res, again)
			require.EqualValues(t, 1, count(t, e, `SELECT count(*) FROM memberships`))
			require.EqualValues(t, 1, count(t, e, `SELECT count(*) FROM companies`))
			checkInvariants(t, e, map[string]companies.LinkResult{"lost-1": res})

			// Without a request ID: PostgreSQL resolves the loss the same
			// way; MySQL has nothing to ask, and RunTx says so rather
			// than guess (the UPDATE did commit).
			e.armCommitDrop()
			_, err = ferry.RunTx(ctx, e.drv, nil, func(ctx context.Context, tx *sql.Tx) (int, error) {
				_, err := tx.ExecContext(ctx, `UPDATE companies SET name = 'Initech Corp'`)
				return 1, err
			})
			if name == "mysql" {
				require.ErrorIs(t, err, ferry.ErrCommitUnknown)
				// The server commits what it received, in its own time:
				// nothing waited for the session that sent it.
				require.Eventually(t, func() bool {
					return count(t, e, `SELECT count(*) FROM companies WHERE name = 'Initech Corp'`) == 1
				}, 10*time.Second, 10*time.Millisecond)
				return
			}
			require.NoError(t, err)
			require.EqualValues(t, 1, count(t, e, `SELECT count(*) FROM companies WHERE name = 'Initech Corp'`))
		})
	}
}

// TestContention: 32 writers across 8 companies for 20 s (3 s with
// -short), new requests and resends mixed; every invariant holds after.
func TestContention(t *testing.T) {
	d := 20 * time.Second
	if testing.Short() {
		d = 3 * time.Second
	}
	if v := os.Getenv("FERRY_CONTENTION_SECONDS"); v != "" {
		s, err := strconv.Atoi(v)
		require.NoError(t, err)
		d = time.Duration(s) * time.Second
	}
	eachBackend(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
		defer cancel()
		var mu sync.Mutex
		results := map[string]companies.LinkResult{}
		inputs := map[string]companies.LinkInput{}
		var calls, resends, gaveUp atomic.Int64
		var gaveUpIDs sync.Map
		stop := time.Now().Add(d)
		var wg sync.WaitGroup
		for w := range 32 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 11))
				for i := 0; time.Now().Before(stop); i++ {
					id := fmt.Sprintf("w%d-%d", w, i)
					in := companies.LinkInput{BusinessNumber: fmt.Sprintf("10000-%d", rng.IntN(8)), CompanyName: "Co", MemberID: fmt.Sprintf("m%d", rng.IntN(40)), Role: "member"}
					if i > 0 && rng.IntN(5) == 0 {
						// resend an earlier request of this writer
						id = fmt.Sprintf("w%d-%d", w, rng.IntN(i))
						mu.Lock()
						prev, ok := inputs[id]
						mu.Unlock()
						if !ok {
							continue
						}
						in = prev
						resends.Add(1)
					}
					res, err := e.app.LinkCompany(ctx, id, in)
					var exhausted *ferry.TxRetriesExhaustedError
					if errors.As(err, &exhausted) {
						// Four writers per company row under REPEATABLE READ,
						// slowed down by the race detector: a request may lose
						// ten times in a row. It must then have had no effect.
						gaveUp.Add(1)
						gaveUpIDs.Store(id, true)
						continue
					}
					if err != nil {
						t.Errorf("%s: %v", id, err)
						return
					}
					calls.Add(1)
					mu.Lock()
					if prev, ok := results[id]; ok && prev != res {
						t.Errorf("%s: resend got %+v, first %+v", id, res, prev)
					}
					results[id], inputs[id] = res, in
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		require.False(t, t.Failed())
		checkInvariants(t, e, results)
		gaveUpIDs.Range(func(k, _ any) bool {
			id := k.(string)
			if _, ok := results[id]; !ok {
				_, err := e.drv.GetRequest(ctx, id)
				require.ErrorIs(t, err, ferrydriver.ErrNotFound, "request %s gave up, yet left a record", id)
			}
			return true
		})
		retries := e.retries.snapshot()
		t.Logf("%s: %d calls (%d resends) over %v by 32 writers on 8 companies, %d gave up after 10 attempts; %d companies, %d memberships; retries by cause %v",
			e.name, calls.Load(), resends.Load(), d, gaveUp.Load(), count(t, e, `SELECT count(*) FROM companies`), count(t, e, `SELECT count(*) FROM memberships`), retries)
		require.LessOrEqual(t, count(t, e, `SELECT count(*) FROM companies`), int64(8))
	})
}

// TestReserveNumbersFirst: taking the display number before the
// transaction keeps the shared row out of it (no conflicts on it), and
// leaves gaps: numbers taken by requests whose company already existed.
func TestReserveNumbersFirst(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		e.app.ReserveNumbersFirst = true
		results := runConcurrently(t, 32, func(i int) (string, companies.LinkResult, error) {
			id := fmt.Sprintf("r-%d", i)
			// 16 companies, each asked for twice
			res, err := e.app.LinkCompany(ctx, id, companies.LinkInput{CompanyName: fmt.Sprintf("Firm %d", i%16), MemberID: "m" + strconv.Itoa(i), Role: "member"})
			return id, res, err
		})
		require.EqualValues(t, 16, count(t, e, `SELECT count(*) FROM companies`))
		require.EqualValues(t, 32, count(t, e, `SELECT value FROM sequences`), "every request took a number")
		checkInvariantsGaps(t, e, results, true)
		t.Logf("%s: retries %v; display numbers up to %d for 16 companies", e.name, e.retries.snapshot(), count(t, e, `SELECT max(display_number) FROM companies`))
	})
}

func TestCanonicalKey(t *testing.T) {
	for _, c := range []struct {
		in   companies.LinkInput
		want string
	}{
		{companies.LinkInput{CompanyName: "Acme Inc."}, "name:acme"},
		{companies.LinkInput{CompanyName: "  ACME,   Incorporated"}, "name:acme"},
		{companies.LinkInput{CompanyName: "Acme Widgets Ltd"}, "name:acme widgets"},
		{companies.LinkInput{CompanyName: "Inc"}, "name:inc"},
		{companies.LinkInput{CompanyName: "Acme", BusinessNumber: "123-45-67890"}, "bn:1234567890"},
	} {
		got, err := companies.CanonicalKey(c.in)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%+v", c.in)
	}
	_, err := companies.CanonicalKey(companies.LinkInput{CompanyName: "!!!"})
	require.ErrorIs(t, err, companies.ErrInvalidInput)
	_, err = companies.CanonicalKey(companies.LinkInput{BusinessNumber: "12"})
	require.True(t, errors.Is(err, companies.ErrInvalidInput))
}

// runConcurrently runs n requests at once and collects their results by
// request ID; a failed request fails the test.
func runConcurrently(t *testing.T, n int, f func(i int) (string, companies.LinkResult, error)) map[string]companies.LinkResult {
	var mu sync.Mutex
	out := map[string]companies.LinkResult{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id, res, err := f(i)
			if err != nil {
				t.Errorf("%s: %v", id, err)
				return
			}
			mu.Lock()
			out[id] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
