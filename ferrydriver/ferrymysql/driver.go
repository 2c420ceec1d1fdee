package ferrymysql

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// Config configures a driver.
type Config struct {
	// DSN is the go-sql-driver/mysql data source name the application's
	// pool was opened with ("user:password@tcp(host:3306)/app"). The feed
	// needs it: it reads the binlog over a replication connection of its
	// own, as that user. Required for OpenFeed (the relay); producers and
	// consumers do without. Open sets it.
	DSN string
	// Partitions is the number of outbox partitions (see
	// ferrydriver.Store.StoredPartitions): 0, the default, follows the count stored with the
	// schema; any other value must match it.
	Partitions int
	// RecoveryMargin is how far before the start of the oldest
	// transaction that was open at its position a feed's recovery scan
	// starts when the binlog it needs was purged (it covers the server's
	// clock going back); when the relay's user may not read
	// INFORMATION_SCHEMA.INNODB_TRX (the PROCESS privilege), how far
	// before the last acknowledged event, and then it must be longer than
	// any producer transaction stays open. Default 5 min.
	RecoveryMargin time.Duration
	// ServerID is the replica server id the feeds' binlog connections
	// present; each connection needs its own, so a feed takes ServerID
	// plus a random offset below 1<<20. Default 1<<30: keep it clear of
	// the ids of real replicas of the server.
	ServerID uint32
	// Logger receives warnings (binlog retention, recovery). Default:
	// discard. The ferry command gives it the relay's logger.
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Partitions < 0 || out.Partitions > ferrydriver.MaxPartitions {
		return out, fmt.Errorf("ferrymysql: Config.Partitions %d is out of range: use 1 to %d, or 0 to follow the count stored in the database",
			out.Partitions, ferrydriver.MaxPartitions)
	}
	if out.RecoveryMargin == 0 {
		out.RecoveryMargin = 5 * time.Minute
	}
	if out.RecoveryMargin < 0 {
		return out, fmt.Errorf("ferrymysql: Config.RecoveryMargin %v is negative: use a duration longer than your longest producer transaction", out.RecoveryMargin)
	}
	if out.ServerID == 0 {
		out.ServerID = 1 << 30
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out, nil
}

// Driver is the MySQL and MariaDB implementation of ferrydriver.Driver,
// for transactions of type *sql.Tx.
type Driver struct {
	cfg Config
	db  *sql.DB
	// dsn is Config.DSN parsed; nil without one.
	dsn *mysql.Config
	// schema is the database the pool's connections use.
	schema string
	// owned: Close closes db (Open made it).
	owned bool
	// stored is the partition count the driver last read; 0 until then.
	stored atomic.Int64
	// knownKeys are keys whose sequence rows this process has updated:
	// an append of one skips the read that tells an existing key from a
	// new one.
	knownKeys keyCache
	// settle is AwaitSettled's binlog reader and its waiters.
	settle settleHub
	// reruns counts transactions run again after a deadlock or a lock
	// wait timeout; duplicates, ingestions run again after meeting a
	// concurrent delivery of their events.
	reruns, duplicates atomic.Int64
	// rereads counts groups too large to hold that a feed read twice.
	rereads atomic.Int64
	// feedLimits, set by tests, replace the feeds' bounds.
	feedLimits *feedLimits
	// unguarded: the server has no idle_transaction_timeout (MySQL), and
	// lease transactions run without the guard (guard.go).
	unguarded atomic.Bool
}

// keyCache remembers up to keyCacheSize keys (it forgets them all when
// full: a forgotten key costs one read).
type keyCache struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

const keyCacheSize = 100_000

func (c *keyCache) has(k string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.keys[k]
	return ok
}

func (c *keyCache) add(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil || len(c.keys) >= keyCacheSize {
		c.keys = make(map[string]struct{})
	}
	c.keys[k] = struct{}{}
}

// forget drops keys PruneKeys removed.
func (c *keyCache) forget(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.keys, k)
}

// New returns a driver over the application's pool. Its connections must
// all use the database that holds (or will hold) Ferry's tables. Create
// them with Migrate (or `ferry migrate up`).
func New(db *sql.DB, cfg *Config) (*Driver, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if db == nil {
		return nil, errors.New("ferrymysql: New needs the application's *sql.DB")
	}
	d := &Driver{cfg: c, db: db}
	if c.DSN != "" {
		if d.dsn, err = mysql.ParseDSN(c.DSN); err != nil {
			return nil, fmt.Errorf("ferrymysql: Config.DSN: %w (use the go-sql-driver/mysql form user:password@tcp(host:3306)/db)", err)
		}
	}
	var schema sql.NullString
	if err := db.QueryRowContext(context.Background(), `SELECT DATABASE()`).Scan(&schema); err != nil {
		return nil, fmt.Errorf("ferrymysql: connect: %w", err)
	}
	if !schema.Valid || schema.String == "" {
		return nil, errors.New("ferrymysql: the connections use no database: name one in the DSN (…/dbname) for Ferry's tables")
	}
	d.schema = schema.String
	return d, nil
}

// Open opens a pool for dsn (go-sql-driver/mysql form; its database holds
// Ferry's tables) and returns a driver over it that Close closes.
func Open(dsn string, cfg *Config) (*Driver, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.DSN = dsn
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("ferrymysql: %w (use the go-sql-driver/mysql form user:password@tcp(host:3306)/db)", err)
	}
	// Statements are sent whole, one at a time; times are stored as
	// integers, so no time zone or parsing setting matters. Parameters
	// are interpolated by the client: a statement costs one round trip,
	// not a prepare and an execute (BenchmarkEmitTx: 1,604 events/s
	// before, 2,005-2,159 after). An application's own pool does better
	// with interpolateParams=true in its DSN too.
	mc.MultiStatements = false
	mc.InterpolateParams = true
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("ferrymysql: %w", err)
	}
	db := sql.OpenDB(conn)
	db.SetConnMaxLifetime(10 * time.Minute)
	d, err := New(db, &c)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	d.owned = true
	return d, nil
}

// DB returns the pool, for the application's own transactions.
func (d *Driver) DB() *sql.DB { return d.db }

// Schema is the database that holds Ferry's tables.
func (d *Driver) Schema() string { return d.schema }

// Close stops settlement's binlog reader, and closes the pool if Open
// made it.
func (d *Driver) Close() error {
	d.settle.close()
	if d.owned {
		return d.db.Close()
	}
	return nil
}

// Name implements ferrydriver.Store.
func (d *Driver) Name() string { return "mysql" }

// Capabilities implements ferrydriver.Store: the binlog pushes commits to
// the feed, and InnoDB has concurrent writers.
func (d *Driver) Capabilities() ferrydriver.Capabilities {
	return ferrydriver.Capabilities{NotifyWakeups: true, ConcurrentWriters: true}
}

// PartitionOf returns the outbox partition Append writes key to.
func (d *Driver) PartitionOf(key string) int {
	n := d.cfg.Partitions
	if n == 0 {
		n = int(d.stored.Load())
	}
	return ferrydriver.PartitionOf(key, n)
}

// write runs fn in a transaction of the pool. A transaction that cannot
// begin fails with ferrydriver.ErrTxNotBegun.
func (d *Driver) write(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	return d.inTx(op, tx, err, fn)
}

// inTx runs fn in tx (err: its BeginTx's) and commits it; a transaction
// fn failed in (or panicked in) is rolled back. A transaction that could
// not begin fails with ferrydriver.ErrTxNotBegun.
func (d *Driver) inTx(op string, tx *sql.Tx, err error, fn func(tx *sql.Tx) error) error {
	if err != nil {
		return fmt.Errorf("%w: %w", ferrydriver.ErrTxNotBegun, d.wrapErr(op, err))
	}
	defer func() { _ = tx.Rollback() }() // after a commit: sql.ErrTxDone
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return d.wrapErr(op+": commit", err)
	}
	return nil
}

// MySQL error numbers the driver tells apart.
const (
	errNoSuchTable    = 1146 // ER_NO_SUCH_TABLE
	errDupEntry       = 1062 // ER_DUP_ENTRY
	errDeadlock       = 1213 // ER_LOCK_DEADLOCK
	errLockWait       = 1205 // ER_LOCK_WAIT_TIMEOUT
	errMasterFatal    = 1236 // ER_MASTER_FATAL_ERROR_READING_BINLOG: purged history
	errAccessDenied   = 1227 // ER_SPECIFIC_ACCESS_DENIED_ERROR
	errUnknownSysVar  = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE
	errCheckViolation = 4025 // ER_CONSTRAINT_FAILED (MariaDB)
)

func errNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

func (d *Driver) wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errNumber(err) == errNoSuchTable {
		return fmt.Errorf("ferrymysql: %s: %w: database %s has no Ferry tables (or not all of them); create them with `ferry migrate up --database-url mysql://…/%s` or Driver.Migrate (%v)",
			op, ferrydriver.ErrSchemaMissing, d.schema, d.schema, err)
	}
	return fmt.Errorf("ferrymysql: %s: %w", op, err)
}

// sqlNow is the server's clock in microseconds since the Unix epoch, UTC
// whatever the session's time zone.
const sqlNow = `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type querier interface {
	queryRower
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func micros(t time.Time) int64 { return t.UnixMicro() }

// eventColumns are the stored forms of an event's fields that need
// encoding.
type eventColumns struct {
	id      []byte
	headers any // JSON bytes, or nil
	payload []byte
}

func encodeEvent(ev *ferryevent.Event) (eventColumns, error) {
	c := eventColumns{id: ev.ID[:], payload: ev.Payload}
	if c.payload == nil {
		c.payload = []byte{} // the payload column is NOT NULL
	}
	if len(ev.Headers) > 0 {
		b, err := json.Marshal(ev.Headers)
		if err != nil {
			return c, fmt.Errorf("ferrymysql: encode headers of event %s: %w", ev.ID, err)
		}
		c.headers = b
	}
	return c, nil
}

func decodeHeaders(ev *ferryevent.Event, headers []byte) error {
	if headers == nil {
		return nil
	}
	if err := json.Unmarshal(headers, &ev.Headers); err != nil {
		return fmt.Errorf("decode headers of event %s: %w", ev.ID, err)
	}
	return nil
}

//go:embed migrations/*.sql
var migrationFiles embed.FS

var _ ferrydriver.Driver[*sql.Tx] = (*Driver)(nil)
