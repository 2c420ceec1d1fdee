package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
)

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, err := pickSubcommand("migrate", args, []subcommand{
		{"up", "apply the migrations the schema lacks (--dry-run shows them)"},
		{"down", "revert the newest migration (--steps N: that many)"},
		{"sql", "print the migrations' SQL for your own migration tool (--down: the down ones)"},
	}, stdout)
	if err != nil {
		return err
	}
	f := newFlags("migrate "+action, stderr)
	var db dbFlags
	db.register(f)
	var steps int
	var down, dry bool
	f.Int(&steps, "steps", "FERRY_MIGRATE_STEPS", 0, "how many migrations (up: 0 = all; down: 0 = one)")
	if action == "sql" {
		f.Bool(&down, "down", "FERRY_MIGRATE_DOWN", false, "print the down migrations instead")
	} else {
		f.Bool(&dry, "dry-run", "FERRY_MIGRATE_DRY_RUN", false, "show what would run without running it")
	}
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	if action == "sql" {
		// No database needed: print the schema for the given name.
		var ms []ferrydriver.Migration
		if _, ok := sqlitePath(db.url); ok {
			ms = ferrysqlite.MigrationsFor(&ferrysqlite.Config{Partitions: db.partitions})
		} else if isMySQLURL(db.url) {
			ms = ferrymysql.MigrationsFor(&ferrymysql.Config{Partitions: db.partitions})
		} else {
			var err error
			if ms, err = ferrypg.MigrationsFor(&ferrypg.Config{Schema: db.schema, Partitions: db.partitions}); err != nil {
				return usagef("%v (set by --schema / FERRY_SCHEMA or --partitions / FERRY_PARTITIONS)", err)
			}
		}
		if down {
			for i := len(ms) - 1; i >= 0; i-- {
				fmt.Fprintf(stdout, "-- %03d_%s (down)\n%s\n", ms[i].Version, ms[i].Name, ms[i].Down)
			}
			return nil
		}
		for _, m := range ms {
			fmt.Fprintf(stdout, "-- %03d_%s (up)\n%s\n", m.Version, m.Name, m.Up)
		}
		return nil
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	res, err := b.store.Migrate(ctx, &ferrydriver.MigrateParams{Down: action == "down", Steps: steps, DryRun: dry})
	if err != nil {
		return err
	}
	verb := map[string]string{"up": "applied", "down": "reverted"}[action]
	if dry {
		verb = "would have " + verb
	}
	if len(res.Applied) == 0 {
		fmt.Fprintf(stdout, "%s is at version %d; nothing to do\n", b.label, res.Current)
		return nil
	}
	for _, m := range res.Applied {
		fmt.Fprintf(stdout, "%s %03d_%s\n", verb, m.Version, m.Name)
	}
	if dry {
		fmt.Fprintf(stdout, "%s would be at version %d (a dry run: nothing was changed)\n", b.label, res.Current)
		return nil
	}
	fmt.Fprintf(stdout, "%s is at version %d\n", b.label, res.Current)
	return nil
}

func migrateUp(ctx context.Context, drv ferrydriver.Store, log *slog.Logger) error {
	res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	if err != nil {
		return err
	}
	for _, m := range res.Applied {
		log.Info("ferry: applied migration", "version", m.Version, "name", m.Name)
	}
	return nil
}
