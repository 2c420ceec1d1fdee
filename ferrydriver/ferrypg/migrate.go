package ferrypg

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations parses migrations/NNN_name.{up,down}.sql.
func loadMigrations() []ferrydriver.Migration {
	byVersion := map[int]*ferrydriver.Migration{}
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		panic(err) // embedded at build time; cannot fail at run time
	}
	for _, e := range entries {
		name := e.Name()
		base, dir, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), ".")
		num, title, ok2 := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || !ok2 || err != nil || (dir != "up" && dir != "down") {
			panic("ferrypg: badly named migration file " + name)
		}
		body, _ := migrationFS.ReadFile("migrations/" + name)
		m := byVersion[v]
		if m == nil {
			m = &ferrydriver.Migration{Version: v, Name: title}
			byVersion[v] = m
		}
		if dir == "up" {
			m.Up = string(body)
		} else {
			m.Down = string(body)
		}
	}
	out := make([]ferrydriver.Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

var allMigrations = loadMigrations()

// Migrations implements ferrydriver.Store. The SQL has the schema name and
// the driver's Config.Partitions filled in (see MigrationsFor), ready for
// `ferry migrate sql` and users' own tools; record the version in
// <schema>.migrations yourself if you apply it that way.
func (d *Driver[TTx]) Migrations() []ferrydriver.Migration {
	return migrationsFor(d.cfg.Schema, d.cfg.Partitions)
}

// Migrations returns the migrations for schema without a database, for
// printing (`ferry migrate sql`). It is MigrationsFor with no partition
// count: migration 004 then stores the count an existing outbox already
// uses, or 1.
func Migrations(schema string) ([]ferrydriver.Migration, error) {
	return MigrationsFor(&Config{Schema: schema})
}

// MigrationsFor returns the migrations for cfg.Schema without a database.
// Migration 004 stores cfg.Partitions as the outbox's partition count; with
// 0 it stores the count an existing outbox already uses (one more than the
// highest partition with a checkpoint or an event), or 1 for a new one.
func MigrationsFor(cfg *Config) ([]ferrydriver.Migration, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return migrationsFor(c.Schema, c.Partitions), nil
}

func migrationsFor(schema string, partitions int) []ferrydriver.Migration {
	s := pgx.Identifier{schema}.Sanitize()
	r := strings.NewReplacer("{schema}", s, "{partitions}", strconv.Itoa(partitions))
	out := make([]ferrydriver.Migration, len(allMigrations))
	for i, m := range allMigrations {
		m.Up = r.Replace(m.Up)
		m.Down = r.Replace(m.Down)
		out[i] = m
	}
	return out
}

// Migrate implements ferrydriver.Store. It runs in one transaction under an
// advisory lock, so concurrent migrators wait for each other and a failed
// migration leaves nothing behind.
func (d *Driver[TTx]) Migrate(ctx context.Context, p *ferrydriver.MigrateParams) (*ferrydriver.MigrateResult, error) {
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("ferrypg: begin migration: %w", err)
	}
	defer func() { _ = rollback(ctx) }()
	s := pgx.Identifier{d.cfg.Schema}.Sanitize()
	if _, err := e.exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('ferry.migrate.' || $1, 0))`, d.cfg.Schema); err != nil {
		return nil, fmt.Errorf("ferrypg: lock migrations: %w", err)
	}
	if _, err := e.exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s); err != nil {
		return nil, fmt.Errorf("ferrypg: create schema %s: %w", d.cfg.Schema, err)
	}
	if _, err := e.exec(ctx, `CREATE TABLE IF NOT EXISTS `+s+`.migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("ferrypg: create migrations table: %w", err)
	}
	current := 0
	if err := queryRow(ctx, e, []any{&current}, `SELECT COALESCE(max(version), 0) FROM `+s+`.migrations`); err != nil {
		return nil, fmt.Errorf("ferrypg: read schema version: %w", err)
	}
	all := d.Migrations()
	res := &ferrydriver.MigrateResult{Current: current}
	if !p.Down {
		for _, m := range all {
			if m.Version <= current || (p.Steps > 0 && len(res.Applied) >= p.Steps) {
				continue
			}
			res.Applied = append(res.Applied, m)
			res.Current = m.Version
			if p.DryRun {
				continue
			}
			if _, err := e.exec(ctx, m.Up); err != nil {
				return nil, fmt.Errorf("ferrypg: apply migration %03d_%s: %w", m.Version, m.Name, err)
			}
			if _, err := e.exec(ctx, `INSERT INTO `+s+`.migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return nil, fmt.Errorf("ferrypg: record migration %d: %w", m.Version, err)
			}
		}
	} else {
		steps := p.Steps
		if steps <= 0 {
			steps = 1
		}
		for i := len(all) - 1; i >= 0 && len(res.Applied) < steps; i-- {
			m := all[i]
			if m.Version > current {
				continue
			}
			res.Applied = append(res.Applied, m)
			res.Current = 0
			if i > 0 {
				res.Current = all[i-1].Version
			}
			if p.DryRun {
				continue
			}
			if _, err := e.exec(ctx, m.Down); err != nil {
				return nil, fmt.Errorf("ferrypg: revert migration %03d_%s: %w", m.Version, m.Name, err)
			}
			if _, err := e.exec(ctx, `DELETE FROM `+s+`.migrations WHERE version = $1`, m.Version); err != nil {
				return nil, fmt.Errorf("ferrypg: unrecord migration %d: %w", m.Version, err)
			}
		}
	}
	if p.DryRun {
		return res, nil
	}
	if err := commit(ctx); err != nil {
		return nil, fmt.Errorf("ferrypg: commit migration: %w", err)
	}
	return res, nil
}
