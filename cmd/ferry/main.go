// Command ferry runs and operates Ferry: the relay daemon, schema
// migrations, status and dead letters.
//
//	ferry demo     see Ferry work end to end, nothing to install
//	ferry run      the daemon: relays for every partition, embedded defaults
//	ferry relay    tail the outbox and publish to NATS JetStream
//	ferry migrate  up | down | sql: create, revert or print the schema
//	ferry partitions  show | set N: the outbox's partition count
//	ferry status   every feed's checkpoint, lag, lease holder and dead letters; the groups
//	ferry dlq      list | show | redrive | discard: relay dead letters (--group: a consumer group's)
//	ferry emit     write events to the outbox from the command line
//	ferry tail     print the events in the JetStream stream
//	ferry bench    drain | latency: measure the relay on this machine
//
// Every flag can also be set by an environment variable, named in the
// flag's help (FERRY_DATABASE_URL, FERRY_NATS_URL, ...). Flags win. The
// exceptions, `dlq --all` and `--yes`, are typed each time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
)

const usage = `ferry moves events from your database's outbox to your broker.

Usage:
  ferry demo    [--crash] [flags]    see Ferry work end to end on its embedded defaults, nothing to install
  ferry run     [--config FILE]      the daemon: relays into NATS JetStream (or Kafka, RabbitMQ, webhooks
                                     with --sink-url); with no database or broker configured, embedded
                                     SQLite and JetStream in ./ferry-data
  ferry relay   [flags]              one relay for one partition of a given database and destination
  ferry chain run|status [flags]     ingest EVM contract logs into a consumer group's inbox, with reorgs
                                     retracted and confirmation tiers; where a group's cursor is
  ferry migrate up|down|sql [flags]  apply, revert or print the schema migrations
  ferry partitions show|set N [flags]
                                     the outbox's partition count, stored with the schema; set refuses
                                     until every relay has delivered everything and stopped
  ferry status  [flags]              every feed's checkpoint, lag, lease and dead letters, and the consumer
                                     groups (--feed hooks or hooks/0; --json; --exact counts)
  ferry ui      [flags]              the web console and its JSON API on --ui-addr (127.0.0.1:9470): every
                                     feed, dead letters, groups, events, actions; reads and actions need
                                     its token, and names other than --ui-host are refused
  ferry dlq list|show|redrive|discard [flags]
                                     relay dead letters, or a consumer group's with --group;
                                     redrive and discard act on what list shows with the same
                                     selection (IDs, --feed, --group, --key, --type, --topic,
                                     --reason, --since, --before, or --all; none: they refuse),
                                     count it and ask (--yes for scripts; --dry-run lists it)
  ferry parked  list|release|skip [key] [flags]
                                     keys the relay set aside while their destination failed,
                                     and redriven dead letters waiting for their feed
  ferry emit    [flags]              write events to the outbox (for trying Ferry out)
  ferry tail    [flags]              print the events stored in the JetStream stream
  ferry bench drain|latency|consume|settle|ingest|e2e [flags]
                                     measure this machine (PostgreSQL)
  ferry version                      the module version, commit and Go version of this binary

--database-url takes postgres://..., mongodb://..., mysql://... (MariaDB) or sqlite:FILE;
without it, commands use the embedded database <data-dir>/ferry.db (--data-dir, default
ferry-data).
Run "ferry <command> -h" for a command's flags. Every flag has a FERRY_*
environment variable (but dlq's --all and --yes, typed each time); flags win over the
environment.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	stopTracing, err := startTracing(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "ferry %s: %v\n", args[0], err)
		return 2
	}
	defer stopTracing()
	switch args[0] {
	case "demo":
		err = cmdDemo(ctx, args[1:], stdout, stderr)
	case "run":
		err = cmdRun(ctx, args[1:], stdout, stderr)
	case "relay":
		err = cmdRelay(ctx, args[1:], stdout, stderr)
	case "migrate":
		err = cmdMigrate(ctx, args[1:], stdout, stderr)
	case "partitions":
		err = cmdPartitions(ctx, args[1:], stdout, stderr)
	case "status":
		err = cmdStatus(ctx, args[1:], stdout, stderr)
	case "dlq":
		err = cmdDLQ(ctx, args[1:], stdout, stderr)
	case "ui":
		err = cmdUI(ctx, args[1:], stdout, stderr)
	case "parked":
		err = cmdParked(ctx, args[1:], stdout, stderr)
	case "emit":
		err = cmdEmit(ctx, args[1:], stdout, stderr)
	case "tail":
		err = cmdTail(ctx, args[1:], stdout, stderr)
	case "bench":
		err = cmdBench(ctx, args[1:], stdout, stderr)
	case "chain":
		err = cmdChain(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		err = cmdVersion(args[1:], stdout)
	default:
		fmt.Fprintf(stderr, "ferry: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Ctrl-C or SIGTERM while the command worked: not a failure of it.
		fmt.Fprintf(stderr, "ferry %s: interrupted\n", args[0])
		return 130
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "ferry %s: %v\n", args[0], err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "ferry %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// subcommand is one action of a command, with what it does.
type subcommand struct{ name, does string }

// pickSubcommand returns the subcommand args[0] names. -h, --help and help
// list the subcommands on stdout (flag.ErrHelp: exit 0); a missing or
// unknown one is a usage error that names them.
func pickSubcommand(command string, args []string, subs []subcommand, stdout io.Writer) (string, error) {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.name
	}
	choices := "ferry " + command + " " + strings.Join(names, " | ")
	if len(args) == 0 {
		return "", usagef("say what to do: %s (ferry %s -h says what each does)", choices, command)
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprintf(stdout, "Usage: ferry %s <subcommand> [flags]\n\nSubcommands:\n", command)
		for _, s := range subs {
			fmt.Fprintf(stdout, "  %-9s %s\n", s.name, s.does)
		}
		fmt.Fprintf(stdout, "\nRun \"ferry %s <subcommand> -h\" for its flags.\n", command)
		return "", flag.ErrHelp
	}
	for _, s := range subs {
		if s.name == args[0] {
			return s.name, nil
		}
	}
	return "", usagef("unknown subcommand %q: %s (ferry %s -h says what each does)", args[0], choices, command)
}

// The version, commit and state of the tree make build stamps (-ldflags
// -X main.version=...): where the build does not stamp version control
// itself (GOFLAGS=-buildvcs=false), they are all there is.
var version, commit, modified string

// cmdVersion prints the module version, the commit it was built from (and
// whether the tree was modified) and the Go version.
func cmdVersion(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q: ferry version takes none", args[0])
	}
	v, c, mod, goVersion := "(unknown)", "", "", "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v, goVersion = bi.Main.Version, bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				c = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					mod = " (modified)"
				}
			}
		}
	}
	if version != "" {
		v = version
	}
	if commit != "" {
		c, mod = commit, ""
		if modified == "true" {
			mod = " (modified)"
		}
	}
	if c == "" && releaseCommit != "" && v != "(devel)" {
		c = releaseCommit + " (the tree " + v + " was released from)"
	}
	if c == "" {
		c = "(unknown: this binary was built without version stamping; make build stamps it)"
	}
	fmt.Fprintf(stdout, "ferry %s\ncommit %s%s\n%s\n", v, c, mod, goVersion)
	return nil
}
