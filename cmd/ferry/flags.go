package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// envFlags binds flags to FERRY_* variables: a variable sets the default,
// a flag on the command line wins.
type envFlags struct {
	fs         *flag.FlagSet
	errs       []error
	positional []string
}

func newFlags(name string, stderr io.Writer) *envFlags {
	fs := flag.NewFlagSet("ferry "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &envFlags{fs: fs}
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
}

func (f *envFlags) Parse(args []string) error {
	if len(f.errs) > 0 {
		return f.errs[0]
	}
	// Flags may come before or after positional arguments.
	var positional []string
	for {
		if err := f.fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return err
			}
			return usageError{err.Error()}
		}
		args = f.fs.Args()
		if len(args) == 0 {
			break
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
	f.positional = positional
	return nil
}

// Args returns the positional arguments.
func (f *envFlags) Args() []string { return f.positional }

// dbFlags are shared by every command that talks to the database.
type dbFlags struct {
	url        string
	schema     string
	partitions int
	noNotify   bool
}

func (d *dbFlags) register(f *envFlags) {
	f.String(&d.url, "database-url", "FERRY_DATABASE_URL", "", "PostgreSQL URL, e.g. postgres://user@localhost:5432/app")
	f.String(&d.schema, "schema", "FERRY_SCHEMA", ferrypg.DefaultSchema, "schema holding Ferry's tables")
	f.Int(&d.partitions, "partitions", "FERRY_PARTITIONS", 1, "number of outbox partitions (same for every producer and relay)")
	f.Bool(&d.noNotify, "no-notify", "FERRY_NO_NOTIFY", false, "do not use LISTEN/NOTIFY: producers send no wake-ups, relays only poll")
}

// open connects and returns the pool and the driver.
func (d *dbFlags) open(ctx context.Context) (*pgxpool.Pool, *ferrypg.Driver[pgx.Tx], error) {
	if d.url == "" {
		return nil, nil, usagef("no database: set --database-url or FERRY_DATABASE_URL, e.g. postgres://user@localhost:5432/app")
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
		return nil, nil, fmt.Errorf("cannot reach the database at --database-url / FERRY_DATABASE_URL (%s): %w", redact(d.url), err)
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
