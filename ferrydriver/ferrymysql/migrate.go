package ferrymysql

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

// Migrations lists Ferry's MySQL schema migrations, oldest first. Their Up
// and Down are SQL that can be applied with other tools (statements end
// with a semicolon at the end of a line); record the version in
// ferry_migrations yourself if you apply them that way. Migration 1 then
// stores 1 as the partition count; a feed with no saved position scans
// the outbox first, since the binlog position of the outbox's creation is
// not recorded.
func Migrations() []ferrydriver.Migration { return MigrationsFor(nil) }

// MigrationsFor lists the migrations with cfg's partition count filled in.
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
			panic("ferrymysql: bad migration file name " + name)
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

// Migrations implements ferrydriver.Store.
func (d *Driver) Migrations() []ferrydriver.Migration { return MigrationsFor(&d.cfg) }

// statements splits a migration into its statements: each ends with a
// semicolon at the end of a line; comment lines are dropped.
func statements(script string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.SplitSeq(script, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// Migrate implements ferrydriver.Store. MySQL commits each DDL statement
// by itself, so a migration is not atomic: migrations run one at a time
// under a named lock (GET_LOCK) of the database, each recorded once all
// its statements ran; one that failed half-way says so, and is finished
// by hand or reverted before it runs again.
func (d *Driver) Migrate(ctx context.Context, p *ferrydriver.MigrateParams) (*ferrydriver.MigrateResult, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, d.wrapErr("migrate", err)
	}
	defer conn.Close()
	lock := "ferry migrate " + d.schema
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 60)`, lock).Scan(&got); err != nil {
		return nil, d.wrapErr("migrate: take the migration lock", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, fmt.Errorf("ferrymysql: migrate: another process has been migrating database %s for a minute (named lock %q): wait for it, or end its session", d.schema, lock)
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(?)`, lock) }()

	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS ferry_migrations (
		version INT NOT NULL PRIMARY KEY, name VARBINARY(255) NOT NULL, applied_at BIGINT NOT NULL) ENGINE=InnoDB`); err != nil {
		return nil, d.wrapErr("create ferry_migrations", err)
	}
	var current int
	if err := conn.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM ferry_migrations`).Scan(&current); err != nil {
		return nil, d.wrapErr("read the schema version", err)
	}
	res := &ferrydriver.MigrateResult{}
	all := d.Migrations()
	run := func(m ferrydriver.Migration, script string, down bool) error {
		for i, st := range statements(script) {
			if _, err := conn.ExecContext(ctx, st); err != nil {
				what := "migration"
				if down {
					what = "revert of migration"
				}
				return fmt.Errorf("ferrymysql: %s %d %s, statement %d: %w (the statements before it took effect: MySQL commits DDL at once; finish or undo them by hand, see `ferry migrate sql`)",
					what, m.Version, m.Name, i+1, err)
			}
		}
		return nil
	}
	if !p.Down {
		for _, m := range all {
			if m.Version <= current || (p.Steps > 0 && len(res.Applied) >= p.Steps) {
				continue
			}
			if !p.DryRun {
				if err := run(m, m.Up, false); err != nil {
					return nil, err
				}
				if m.Version == 1 {
					d.recordBinlogStart(ctx, conn)
				}
				if _, err := conn.ExecContext(ctx, `INSERT INTO ferry_migrations (version, name, applied_at) VALUES (?, ?, `+sqlNow+`)`, m.Version, m.Name); err != nil {
					return nil, d.wrapErr(fmt.Sprintf("record migration %d", m.Version), err)
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
				if err := run(m, m.Down, true); err != nil {
					return nil, err
				}
				if _, err := conn.ExecContext(ctx, `DELETE FROM ferry_migrations WHERE version = ?`, m.Version); err != nil {
					return nil, d.wrapErr(fmt.Sprintf("unrecord migration %d", m.Version), err)
				}
			}
			res.Applied = append(res.Applied, m)
			current = m.Version - 1
		}
	}
	res.Current = current
	return res, nil
}

// recordBinlogStart stores where the binlog stands now that the outbox
// exists: a feed with no saved position starts there. Without the binlog
// (or the privilege to read its position) nothing is stored, and such a
// feed scans the outbox first.
func (d *Driver) recordBinlogStart(ctx context.Context, conn *sql.Conn) {
	file, pos, err := masterStatus(ctx, conn)
	switch {
	case err != nil:
		d.cfg.Logger.Warn("ferrymysql: the binlog's position could not be read after creating the outbox: a relay's first read will scan the outbox",
			"database", d.schema, "err", err)
		return
	case file == "":
		d.cfg.Logger.Warn("ferrymysql: the server writes no binlog (log_bin is off), which the relay reads: its feed is refused until the server runs with "+
			"log-bin, binlog_format=ROW and binlog_row_image=FULL (restart it with them; see the ferrymysql package's doc); producers can write the outbox meanwhile, "+
			"and the relay's first read then scans it", "database", d.schema)
		return
	}
	if _, err := conn.ExecContext(ctx, `UPDATE ferry_settings SET binlog_file = ?, binlog_pos = ? WHERE id = 1`, file, pos); err != nil {
		d.cfg.Logger.Warn("ferrymysql: recording the binlog's position failed: a relay's first read will scan the outbox", "err", err)
	}
}

// masterStatus reads the binlog's current end: "" when the server writes
// no binlog.
func masterStatus(ctx context.Context, q querier) (string, uint32, error) {
	rows, err := q.QueryContext(ctx, `SHOW MASTER STATUS`)
	if err != nil {
		return "", 0, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return "", 0, err
	}
	if !rows.Next() {
		return "", 0, rows.Err()
	}
	vals := make([]any, len(cols))
	var file string
	var pos uint32
	vals[0], vals[1] = &file, &pos
	for i := 2; i < len(vals); i++ {
		vals[i] = new(sql.RawBytes)
	}
	if err := rows.Scan(vals...); err != nil {
		return "", 0, err
	}
	return file, pos, rows.Err()
}
