package ferrysqlite

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// Migrations lists Ferry's SQLite schema migrations, oldest first. Their Up
// and Down are SQL that can be applied with other tools; record the version
// in ferry_migrations yourself if you apply them that way. It is
// MigrationsFor with no partition count: migration 004 then stores the count
// an existing outbox already uses, or 1.
func Migrations() []ferrydriver.Migration { return MigrationsFor(nil) }

// MigrationsFor lists the migrations with cfg's partition count filled in:
// migration 004 stores cfg.Partitions as the outbox's partition count, or,
// when it is 0, the count an existing outbox already uses (one more than
// the highest partition with a checkpoint or an event), or 1.
func MigrationsFor(cfg *Config) []ferrydriver.Migration {
	partitions := 0
	if cfg != nil {
		partitions = cfg.Partitions
	}
	fill := strings.NewReplacer("{partitions}", strconv.Itoa(partitions))
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		panic(err) // embedded at build time
	}
	byVersion := map[int]*ferrydriver.Migration{}
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic("ferrysqlite: bad migration file name " + name)
		}
		body, err := fs.ReadFile(migrationFiles, "migrations/"+name)
		if err != nil {
			panic(err)
		}
		m := byVersion[v]
		if m == nil {
			m = &ferrydriver.Migration{Version: v}
			byVersion[v] = m
		}
		switch {
		case strings.HasSuffix(rest, ".up.sql"):
			m.Name, m.Up = strings.TrimSuffix(rest, ".up.sql"), fill.Replace(string(body))
		case strings.HasSuffix(rest, ".down.sql"):
			m.Down = fill.Replace(string(body))
		}
	}
	out := make([]ferrydriver.Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// Migrations implements ferrydriver.Store: MigrationsFor the driver's
// configuration.
func (d *Driver) Migrations() []ferrydriver.Migration { return MigrationsFor(&d.cfg) }

// Migrate implements ferrydriver.Store. It runs in one transaction.
func (d *Driver) Migrate(ctx context.Context, p *ferrydriver.MigrateParams) (*ferrydriver.MigrateResult, error) {
	res := &ferrydriver.MigrateResult{}
	err := d.write(ctx, "migrate", func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS ferry_migrations (
			version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`); err != nil {
			return fmt.Errorf("ferrysqlite: create ferry_migrations: %w", err)
		}
		var current int
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(max(version), 0) FROM ferry_migrations`).Scan(&current); err != nil {
			return fmt.Errorf("ferrysqlite: read schema version: %w", err)
		}
		all := d.Migrations()
		if !p.Down {
			for _, m := range all {
				if m.Version <= current || (p.Steps > 0 && len(res.Applied) >= p.Steps) {
					continue
				}
				if !p.DryRun {
					if _, err := tx.ExecContext(ctx, m.Up); err != nil {
						return fmt.Errorf("ferrysqlite: migration %d %s: %w", m.Version, m.Name, err)
					}
					if _, err := tx.ExecContext(ctx, `INSERT INTO ferry_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
						m.Version, m.Name, micros(now())); err != nil {
						return fmt.Errorf("ferrysqlite: record migration %d: %w", m.Version, err)
					}
				}
				res.Applied = append(res.Applied, m)
				current = m.Version
			}
		} else {
			steps := max(p.Steps, 1)
			for i := len(all) - 1; i >= 0 && len(res.Applied) < steps; i-- {
				m := all[i]
				if m.Version > current {
					continue
				}
				if !p.DryRun {
					if _, err := tx.ExecContext(ctx, m.Down); err != nil {
						return fmt.Errorf("ferrysqlite: revert migration %d %s: %w", m.Version, m.Name, err)
					}
					if _, err := tx.ExecContext(ctx, `DELETE FROM ferry_migrations WHERE version = ?`, m.Version); err != nil {
						return fmt.Errorf("ferrysqlite: unrecord migration %d: %w", m.Version, err)
					}
				}
				res.Applied = append(res.Applied, m)
				current = m.Version - 1
			}
		}
		res.Current = current
		if p.DryRun {
			return errDryRun
		}
		return nil
	})
	if err == errDryRun {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

var errDryRun = fmt.Errorf("dry run")
