package ferrysqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"modernc.org/sqlite"
)

// Config configures a driver. The zero value is usable.
type Config struct {
	// Partitions is the number of outbox partitions: the outbox is split
	// by key hash so that several relays can share the work, one per
	// partition. The count is stored in the database (migration 004 stores
	// this value, or 1) and changed only by SetPartitions.
	//
	// 0, the default, follows the stored count. Any other value is an
	// assertion: a driver whose count differs from the stored one refuses
	// to append and to open feeds, with an error wrapping
	// ferrydriver.ErrMisconfigured, rather than put a key's events into
	// another partition than the other producers.
	Partitions int
	// Synchronous is SQLite's synchronous setting for the write handle:
	// "FULL" (default) makes every commit durable before it returns;
	// "NORMAL" is faster, and in WAL mode a power loss (not a process
	// crash) may undo the last commits, events included.
	Synchronous string
	// BusyTimeout is how long a write waits for another process's write
	// lock before it fails with SQLITE_BUSY. Default 10 s.
	BusyTimeout time.Duration
	// ReadConns bounds the read handle's connections. Default 4.
	ReadConns int
	// Logger receives warnings. Default: discard.
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Partitions < 0 || out.Partitions > ferrydriver.MaxPartitions {
		return out, fmt.Errorf("ferrysqlite: Config.Partitions %d is out of range: use 1 to %d, or 0 to follow the count stored in the database", out.Partitions, ferrydriver.MaxPartitions)
	}
	switch strings.ToUpper(out.Synchronous) {
	case "":
		out.Synchronous = "FULL"
	case "FULL", "NORMAL", "EXTRA":
		out.Synchronous = strings.ToUpper(out.Synchronous)
	default:
		return out, fmt.Errorf("ferrysqlite: Config.Synchronous %q: use FULL, NORMAL or EXTRA", out.Synchronous)
	}
	if out.BusyTimeout == 0 {
		out.BusyTimeout = 10 * time.Second
	}
	if out.ReadConns <= 0 {
		out.ReadConns = 4
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out, nil
}

// Driver is the SQLite implementation of ferrydriver.Driver and
// ferrydriver.Inbox, for transactions of type *sql.Tx.
type Driver struct {
	cfg    Config
	path   string
	w      *sql.DB // the write handle: one connection, BEGIN IMMEDIATE
	r      *sql.DB // the read handle: query_only connections
	rconn  *connector
	events *commitEvents
	// stored is the partition count the driver last read; 0 until then.
	stored atomic.Int64
}

// Open opens (creating it if needed) the SQLite database file at path and
// returns a driver over it. The driver owns its handles: Close closes them.
// Create Ferry's tables with Migrate (or `ferry migrate up`).
func Open(path string, cfg *Config) (*Driver, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("ferrysqlite: Open needs a database file path")
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("ferrysqlite: database path %q contains '?' or '#': rename the file or its directory", path)
	}
	if dir := filepath.Dir(path); dir != "" {
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("ferrysqlite: the directory of database %s: %w (create it first)", path, err)
		}
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(c.BusyTimeout.Milliseconds(), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+c.Synchronous+")")
	q.Set("_txlock", "immediate")
	events := newCommitEvents()
	w := sql.OpenDB(&connector{dsn: path + "?" + q.Encode(), inner: &sqlite.Driver{}, events: events})
	// One connection: in-process writers queue for it instead of spinning
	// on SQLITE_BUSY, and its commits are the ones the driver announces.
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	if err := w.Ping(); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("ferrysqlite: open %s: %w", path, err)
	}
	rq := url.Values{}
	rq.Add("_pragma", "busy_timeout("+strconv.FormatInt(c.BusyTimeout.Milliseconds(), 10)+")")
	rq.Add("_pragma", "query_only(1)")
	rconn := &connector{dsn: path + "?" + rq.Encode(), inner: &sqlite.Driver{}, events: newCommitEvents()}
	r := sql.OpenDB(rconn)
	r.SetMaxOpenConns(c.ReadConns)
	r.SetMaxIdleConns(c.ReadConns)
	return &Driver{cfg: c, path: path, w: w, r: r, rconn: rconn, events: events}, nil
}

// DB returns the write handle, for the application's own transactions:
// begin them here and pass them to EmitTx and handlers' writes. It has a
// single connection, so inside a transaction use the transaction for
// everything; a second statement on DB() from the same goroutine would
// wait for the transaction to end, forever.
func (d *Driver) DB() *sql.DB { return d.w }

// ReadDB returns the read handle: query_only connections that read
// committed data while a write transaction runs, for the application's
// reads outside transactions.
func (d *Driver) ReadDB() *sql.DB { return d.r }

// Path is the database file.
func (d *Driver) Path() string { return d.path }

// Close closes the driver's handles.
func (d *Driver) Close() error {
	return errors.Join(d.r.Close(), d.w.Close())
}

// Name implements ferrydriver.Store.
func (d *Driver) Name() string { return "sqlite" }

// Capabilities implements ferrydriver.Store.
func (d *Driver) Capabilities() ferrydriver.Capabilities {
	return ferrydriver.Capabilities{NotifyWakeups: true, ConcurrentWriters: false}
}

// PartitionOf returns the outbox partition Append writes key to
// (ferrydriver.PartitionOf): by Config.Partitions, or, when that is 0, by
// the stored count as the driver last read it (1 before it read one).
func (d *Driver) PartitionOf(key string) int {
	n := d.cfg.Partitions
	if n == 0 {
		n = int(d.stored.Load())
	}
	return ferrydriver.PartitionOf(key, n)
}

// holdsWriter marks a context whose goroutine holds the write connection
// (inside RunInTx: a consumer handler, a RunTx callback).
type holdsWriter struct{}

// ErrWriterHeld is returned when a write is asked for on a context that
// already holds the write transaction: it would wait for itself forever.
var ErrWriterHeld = errors.New("ferrysqlite: this call needs the write connection, which the transaction of this context holds: " +
	"inside a handler or RunTx callback, write through its tx (EmitTx, not Emit; no nested RunTx)")

// beginWrite begins a transaction on the write handle, refusing to wait
// for a connection the caller itself holds.
func (d *Driver) beginWrite(ctx context.Context) (*sql.Tx, error) {
	if ctx.Value(holdsWriter{}) != nil {
		return nil, ErrWriterHeld
	}
	return d.w.BeginTx(ctx, nil)
}

// write runs fn in a write transaction on the write handle. A transaction
// that cannot begin fails with ferrydriver.ErrTxNotBegun.
func (d *Driver) write(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	tx, err := d.beginWrite(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ferrydriver.ErrTxNotBegun, d.wrapErr(op, err))
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return d.wrapErr(op+": commit", err)
	}
	return nil
}

func (d *Driver) wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if strings.Contains(err.Error(), "no such table: ferry_settings") {
		return fmt.Errorf("ferrysqlite: %s: %w: database %s has no stored partition count (migration 004); apply it with `ferry migrate up --database-url sqlite:%s` or Driver.Migrate (%v)",
			op, ferrydriver.ErrSchemaMissing, d.path, d.path, err)
	}
	if strings.Contains(err.Error(), "no such table: ferry_") {
		return fmt.Errorf("ferrysqlite: %s: %w: database %s has no Ferry tables; create them with `ferry migrate up --database-url sqlite:%s` or Driver.Migrate (%v)",
			op, ferrydriver.ErrSchemaMissing, d.path, d.path, err)
	}
	return fmt.Errorf("ferrysqlite: %s: %w", op, err)
}

// AppendTx implements ferrydriver.Driver: the events are written in tx
// (a transaction of DB()) and share its fate.
func (d *Driver) AppendTx(ctx context.Context, tx *sql.Tx, events []*ferryevent.Event) error {
	return d.append(ctx, tx, events)
}

// Append implements ferrydriver.Store.
func (d *Driver) Append(ctx context.Context, events []*ferryevent.Event) error {
	return d.write(ctx, "append", func(tx *sql.Tx) error { return d.append(ctx, tx, events) })
}

// sqlAppend writes one event with its key's next sequence number. The
// single writer makes the read of the key's row and the write of the
// outbox row atomic; sqlKeyAppended then records the number, the row's id
// and the time for PruneKeys. A key PruneKeys forgot has no row: Seq 1.
const sqlAppend = `
INSERT INTO ferry_outbox (partition, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at)
VALUES (?1, ?2, ?3, ?4, COALESCE((SELECT seq FROM ferry_keys WHERE key = ?4), 0) + 1, ?5, ?6, ?7, ?8, ?9, ?10)
RETURNING id, seq`

const sqlKeyAppended = `
INSERT INTO ferry_keys (key, seq, last_id, touched_at) VALUES (?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE SET seq = excluded.seq, last_id = excluded.last_id, touched_at = excluded.touched_at`

func (d *Driver) append(ctx context.Context, tx *sql.Tx, events []*ferryevent.Event) error {
	if len(events) == 0 {
		return nil
	}
	// The stored partition count, read in the write transaction: no other
	// writer can change it before this one commits. In process, that costs
	// microseconds, no round trip.
	partitions, err := d.writeCount(ctx, tx, "append")
	if err != nil {
		return err
	}
	ins, err := tx.PrepareContext(ctx, sqlAppend)
	if err != nil {
		return d.wrapErr("append", err)
	}
	defer ins.Close()
	keyStmt, err := tx.PrepareContext(ctx, sqlKeyAppended)
	if err != nil {
		return d.wrapErr("append", err)
	}
	defer keyStmt.Close()
	t := micros(now())
	for _, ev := range events {
		c, err := encodeEvent(ev)
		if err != nil {
			return err
		}
		var id, seq int64
		if err := ins.QueryRowContext(ctx, ferrydriver.PartitionOf(ev.Key, partitions), c.id, ev.Topic, ev.Key, ev.Type, ev.Source, ev.ContentType,
			c.headers, c.payload, micros(ev.CreatedAt)).Scan(&id, &seq); err != nil {
			return d.wrapErr("append", err)
		}
		if _, err := keyStmt.ExecContext(ctx, ev.Key, seq, id, t); err != nil {
			return d.wrapErr("append: sequence of key "+ev.Key, err)
		}
		ev.Seq = seq
	}
	return nil
}

// eventColumns are the columns of an event that need encoding.
type eventColumns struct {
	id      string
	headers any // JSON text, or nil
	payload []byte
}

func encodeEvent(ev *ferryevent.Event) (eventColumns, error) {
	c := eventColumns{id: ev.ID.String(), payload: ev.Payload}
	if c.payload == nil {
		c.payload = []byte{} // the payload column is NOT NULL
	}
	if len(ev.Headers) > 0 {
		b, err := json.Marshal(ev.Headers)
		if err != nil {
			return c, fmt.Errorf("ferrysqlite: encode headers of event %s: %w", ev.ID, err)
		}
		c.headers = string(b)
	}
	return c, nil
}

func decodeHeaders(ev *ferryevent.Event, headers sql.NullString) error {
	if !headers.Valid {
		return nil
	}
	if err := json.Unmarshal([]byte(headers.String), &ev.Headers); err != nil {
		return fmt.Errorf("decode headers of event %s: %w", ev.ID, err)
	}
	return nil
}

// micros is the stored form of a time: microseconds since the Unix epoch.
func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func nullMicros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return micros(t)
}

// now is the database's clock: SQLite has none of its own, and every
// process sharing the file shares the host's.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

//go:embed migrations/*.sql
var migrationFiles embed.FS

var _ ferrydriver.Driver[*sql.Tx] = (*Driver)(nil)
