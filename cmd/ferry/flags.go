package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrychain"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymongo"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryui"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
)

// envFlags binds flags to FERRY_* variables: a variable sets the default,
// a flag on the command line wins.
type envFlags struct {
	fs         *flag.FlagSet
	errs       []error
	positional []string
	// kinds names what each flag that takes a value wants, for the line
	// that says a value was wrong ("a duration such as 500ms or 2s").
	kinds map[string]string
	// acceptArgs: the command reads positional arguments (Args); without
	// it, Parse refuses them instead of ignoring them.
	acceptArgs bool
}

// AcceptArgs lets Parse take positional arguments, which the command reads
// with Args.
func (f *envFlags) AcceptArgs() { f.acceptArgs = true }

func newFlags(name string, stderr io.Writer) *envFlags {
	fs := flag.NewFlagSet("ferry "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &envFlags{fs: fs, kinds: map[string]string{}}
}

func (f *envFlags) String(p *string, name, env, def, help string) {
	if v, ok := os.LookupEnv(env); ok {
		def = v
	}
	f.fs.StringVar(p, name, def, help+" ("+env+")")
}

func (f *envFlags) Int(p *int, name, env string, def int, help string) {
	if v, ok := os.LookupEnv(env); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			f.errs = append(f.errs, usagef("%s=%q is not a whole number (it sets --%s)", env, v, name))
		} else {
			def = n
		}
	}
	f.fs.IntVar(p, name, def, help+" ("+env+")")
	f.kinds[name] = "a whole number"
}

func (f *envFlags) Duration(p *time.Duration, name, env string, def time.Duration, help string) {
	if v, ok := os.LookupEnv(env); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.errs = append(f.errs, usagef("%s=%q is not a duration such as 500ms or 2s (it sets --%s)", env, v, name))
		} else {
			def = d
		}
	}
	f.fs.DurationVar(p, name, def, help+" ("+env+")")
	f.kinds[name] = "a duration with its unit, such as 500ms, 2s or 1m"
}

func (f *envFlags) Bool(p *bool, name, env string, def bool, help string) {
	if v, ok := os.LookupEnv(env); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			f.errs = append(f.errs, usagef("%s=%q is not true or false (it sets --%s)", env, v, name))
		} else {
			def = b
		}
	}
	f.fs.BoolVar(p, name, def, help+" ("+env+")")
	f.kinds[name] = "true or false"
}

// CommandLineBool is a flag with no variable: what it says (select
// everything, do not ask) must be typed on the command line each time.
func (f *envFlags) CommandLineBool(p *bool, name, help string) {
	f.fs.BoolVar(p, name, false, help+" (command line only: no variable sets it)")
}

func (f *envFlags) Parse(args []string) error {
	if len(f.errs) > 0 {
		return f.errs[0]
	}
	// Flags may come before or after positional arguments. The flag
	// package writes a bad flag's error and the whole usage: the usage
	// is for -h, a mistake gets one line that says what is wrong.
	out := f.fs.Output()
	var said bytes.Buffer
	f.fs.SetOutput(&said)
	defer f.fs.SetOutput(out)
	var positional []string
	for {
		if err := f.fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				_, _ = out.Write(said.Bytes())
				return err
			}
			return usageError{f.mistake(err)}
		}
		args = f.fs.Args()
		if len(args) == 0 {
			break
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
	if len(positional) > 0 && !f.acceptArgs {
		return usagef("unexpected argument %q: %s takes flags only (-h lists them)", positional[0], f.fs.Name())
	}
	f.positional = positional
	return nil
}

// mistake is a parse error on one line: what was wrong, what the flag
// wants, and where the flags are listed.
func (f *envFlags) mistake(err error) string {
	msg := err.Error()
	for name, kind := range f.kinds {
		if strings.Contains(msg, "for flag -"+name+":") {
			msg = msg[:strings.Index(msg, "for flag -"+name+":")] + "for flag -" + name + ": give " + kind
			break
		}
	}
	return msg + " (" + f.fs.Name() + " -h lists the flags)"
}

// isSet reports whether the flag was given on the command line.
func (f *envFlags) isSet(name string) bool {
	set := false
	f.fs.Visit(func(fl *flag.Flag) {
		if fl.Name == name {
			set = true
		}
	})
	return set
}

// Args returns the positional arguments.
func (f *envFlags) Args() []string { return f.positional }

// dbFlags are shared by every command that talks to the database.
type dbFlags struct {
	url        string
	schema     string
	partitions int
	noNotify   bool
	dataDir    string
	// log receives the backend's own log lines (default: slog's default
	// logger); a daemon sets its own.
	log *slog.Logger
}

func (d *dbFlags) logger() *slog.Logger {
	if d.log != nil {
		return d.log
	}
	return slog.Default()
}

func (d *dbFlags) register(f *envFlags) {
	f.String(&d.url, "database-url", "FERRY_DATABASE_URL", "",
		"postgres://user@host:5432/app, mongodb://host/app?replicaSet=rs0, mysql://user:password@host:3306/app (MariaDB 10.6+), or sqlite:path/to/file.db (default: the embedded database, <data-dir>/ferry.db, when it exists)")
	f.String(&d.schema, "schema", "FERRY_SCHEMA", ferrypg.DefaultSchema, "PostgreSQL schema holding Ferry's tables")
	f.Int(&d.partitions, "partitions", "FERRY_PARTITIONS", 0, "number of outbox partitions; 0: the count stored with the schema (ferry partitions show says it), another value must match it")
	f.Bool(&d.noNotify, "no-notify", "FERRY_NO_NOTIFY", false, "PostgreSQL: do not use LISTEN/NOTIFY: producers send no wake-ups, relays only poll")
	f.String(&d.dataDir, "data-dir", "FERRY_DATA_DIR", "ferry-data", "directory of the embedded defaults: SQLite database ferry.db and the NATS store")
}

// sqlitePath returns the file of a sqlite: URL.
func sqlitePath(u string) (string, bool) {
	for _, prefix := range []string{"sqlite://", "sqlite:"} {
		if rest, ok := strings.CutPrefix(u, prefix); ok {
			return rest, true
		}
	}
	return "", false
}

// embeddedDB is the default SQLite database file.
func (d *dbFlags) embeddedDB() string { return filepath.Join(d.dataDir, "ferry.db") }

// backend is an open database of either kind, with what the commands need.
type backend struct {
	name   string // "postgres" or "sqlite"
	label  string // "schema ferry" or "database ferry-data/ferry.db", for messages
	store  ferrydriver.Store
	inbox  inboxAdmin
	emit   func(ctx context.Context, events ...*ferry.Event) error
	ping   func(ctx context.Context) error
	close  func()
	sqlite *ferrysqlite.Driver // set for SQLite
	// chainInbox returns a group's inbox for a chain source, reporting
	// its deliveries to hooks and logging to log.
	chainInbox func(group string, log *slog.Logger, hooks []ferryhook.Hook) (ferrychain.Inbox, error)
}

// inboxAdmin is what operators do with consumer groups' inboxes.
type inboxAdmin = ferryui.Inbox

func emitter[TTx any](drv ferrydriver.Driver[TTx]) (func(ctx context.Context, events ...*ferry.Event) error, error) {
	c, err := ferry.NewClient(drv, &ferry.Config{Hooks: hooks})
	if err != nil {
		return nil, err
	}
	return c.Emit, nil
}

// open opens the database named by --database-url. Without one it opens
// the embedded SQLite database in --data-dir: always when create is set
// (creating the directory), otherwise only if it exists.
func (d *dbFlags) open(ctx context.Context, create bool) (*backend, error) {
	path, isSQLite := sqlitePath(d.url)
	if d.url == "" {
		path, isSQLite = d.embeddedDB(), true
		if create {
			if err := os.MkdirAll(d.dataDir, 0o750); err != nil {
				return nil, fmt.Errorf("create --data-dir / FERRY_DATA_DIR %s: %w", d.dataDir, err)
			}
		} else if _, err := os.Stat(path); err != nil {
			return nil, usagef("no database: set --database-url or FERRY_DATABASE_URL (postgres://user@localhost:5432/app or sqlite:app.db); "+
				"the embedded default %s does not exist (`ferry run` creates it, in --data-dir)", path)
		}
	}
	if strings.HasPrefix(d.url, "mongodb://") || strings.HasPrefix(d.url, "mongodb+srv://") {
		return d.openMongo(ctx)
	}
	if isMySQLURL(d.url) {
		return d.openMySQL(ctx)
	}
	if isSQLite {
		if path == "" {
			return nil, usagef("--database-url %q names no file: use sqlite:path/to/file.db", d.url)
		}
		drv, err := ferrysqlite.Open(path, &ferrysqlite.Config{Partitions: d.partitions})
		if err != nil {
			return nil, err
		}
		emit, err := emitter(drv)
		if err != nil {
			_ = drv.Close()
			return nil, err
		}
		return &backend{
			name: "sqlite", label: "database " + path, store: drv, inbox: drv, emit: emit, chainInbox: chainInboxFor(drv),
			ping:  func(ctx context.Context) error { return drv.DB().PingContext(ctx) },
			close: func() { _ = drv.Close() }, sqlite: drv,
		}, nil
	}
	pool, drv, err := d.openPG(ctx)
	if err != nil {
		return nil, err
	}
	emit, err := emitter(drv)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &backend{
		name: "postgres", label: "schema " + d.schema, store: drv, inbox: drv, emit: emit, chainInbox: chainInboxFor(drv),
		ping: pool.Ping, close: pool.Close,
	}, nil
}

// openMongo connects to MongoDB; the database is the URL's path
// (mongodb://host/app), "ferry" when it has none.
func (d *dbFlags) openMongo(ctx context.Context) (*backend, error) {
	cs, err := connstring.ParseAndValidate(d.url)
	if err != nil {
		return nil, usagef("--database-url / FERRY_DATABASE_URL is not a MongoDB URL: %v", err)
	}
	dbName := cs.Database
	if dbName == "" {
		dbName = "ferry"
	}
	client, err := mongo.Connect(options.Client().ApplyURI(d.url))
	if err != nil {
		return nil, usagef("--database-url / FERRY_DATABASE_URL: %v", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := client.Ping(pctx, nil); err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("cannot reach MongoDB at --database-url / FERRY_DATABASE_URL: %w", err)
	}
	drv, err := ferrymongo.New(ctx, client, dbName, &ferrymongo.Config{Partitions: d.partitions})
	if err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, err
	}
	emit, err := emitter(drv)
	if err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, err
	}
	return &backend{
		name: "mongodb", label: "database " + dbName, store: drv, inbox: drv, emit: emit, chainInbox: chainInboxFor(drv),
		ping:  func(ctx context.Context) error { return client.Ping(ctx, nil) },
		close: func() { _ = client.Disconnect(context.Background()) },
	}, nil
}

// openPG connects to PostgreSQL and returns the pool and the driver.
func (d *dbFlags) openPG(ctx context.Context) (*pgxpool.Pool, *ferrypg.Driver[pgx.Tx], error) {
	if d.url == "" {
		return nil, nil, usagef("no database: set --database-url or FERRY_DATABASE_URL, e.g. postgres://user@localhost:5432/app")
	}
	if _, ok := sqlitePath(d.url); ok {
		return nil, nil, usagef("this command needs PostgreSQL; --database-url %s is SQLite", d.url)
	}
	cfg, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		return nil, nil, usagef("--database-url / FERRY_DATABASE_URL is not a PostgreSQL URL: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the database: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("cannot reach the database at --database-url / FERRY_DATABASE_URL (%s): %s", redact(d.url), oneLine(err))
	}
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: d.schema, Partitions: d.partitions, DisableNotify: d.noNotify})
	if err != nil {
		pool.Close()
		return nil, nil, usagef("%v (set by --schema / FERRY_SCHEMA or --partitions / FERRY_PARTITIONS)", err)
	}
	return pool, drv, nil
}

// redact hides a password in a URL.
func redact(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil || cfg.Password == "" {
		return u
	}
	return fmt.Sprintf("postgres://%s:***@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// oneLine is err's message on one line, each distinct part once: pgx lists
// the cause of a failed connection once per address and TLS mode tried,
// on lines of their own.
func oneLine(err error) string {
	var parts []string
	seen := map[string]bool{}
	for _, p := range strings.Split(err.Error(), "\n") {
		p = strings.TrimSpace(p)
		if p == "" || seen[p] {
			continue
		}
		seen[p] = true
		parts = append(parts, strings.TrimSuffix(p, ":"))
	}
	return strings.Join(parts, ": ")
}
