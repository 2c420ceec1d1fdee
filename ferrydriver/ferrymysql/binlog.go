package ferrymysql

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// binlogSyncer returns a replication connection for Config.DSN (set up as
// the feed's: a server id of its own, MariaDB's flavour), which decodes
// the rows of the events of the tables keep accepts only (the others
// arrive with no rows).
func (d *Driver) binlogSyncer(purpose string, keep func(*replication.RowsEvent) bool) (*replication.BinlogSyncer, error) {
	if d.dsn == nil {
		return nil, fmt.Errorf("ferrymysql: %s: %w: no Config.DSN to open a replication connection with (ferrymysql.Open sets it)", purpose, ferrydriver.ErrMisconfigured)
	}
	host, portText, err := net.SplitHostPort(d.dsn.Addr)
	if err != nil || (d.dsn.Net != "tcp" && d.dsn.Net != "") {
		return nil, fmt.Errorf("ferrymysql: %s: %w: the binlog is read over TCP, and Config.DSN's address %s (%s) is not host:port", purpose, ferrydriver.ErrMisconfigured, d.dsn.Addr, d.dsn.Net)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("ferrymysql: %s: %w: port %q of Config.DSN", purpose, ferrydriver.ErrMisconfigured, portText)
	}
	return replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID:         d.cfg.ServerID + uint32(rand.IntN(1<<20)),
		Flavor:           gomysql.MariaDBFlavor,
		Host:             host,
		Port:             uint16(port),
		User:             d.dsn.User,
		Password:         d.dsn.Passwd,
		TLSConfig:        d.dsn.TLS,
		HeartbeatPeriod:  time.Second,
		ReadTimeout:      30 * time.Second,
		DisableRetrySync: true,
		DiscardGTIDSet:   true, // a feed keeps its own
		// Events read ahead of their reader: a bound on memory (a rows
		// event holds up to a few MiB of rows).
		EventCacheCount: 256,
		Logger:          slog.New(quietHandler{d.cfg.Logger.Handler()}).With("binlog", purpose),
		RowsEventDecodeFunc: func(e *replication.RowsEvent, data []byte) error {
			pos, err := e.DecodeHeader(data)
			if err != nil || !keep(e) {
				return err
			}
			return e.DecodeData(pos, data)
		},
	}), nil
}

// quietHandler passes go-mysql's log on with its INFO records (every
// binlog rotation, every connection's start and end) as DEBUG: the feed
// reports what matters to an operator itself.
type quietHandler struct{ slog.Handler }

func (h quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, quiet(l))
}

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = quiet(r.Level)
	return h.Handler.Handle(ctx, r)
}

func (h quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(as)}
}
func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name)}
}

func quiet(l slog.Level) slog.Level {
	if l <= slog.LevelInfo {
		return slog.LevelDebug
	}
	return l
}

// checkBinlog checks the server's binlog settings the feed needs.
func (d *Driver) checkBinlog(ctx context.Context) error {
	if d.dsn == nil {
		return fmt.Errorf("ferrymysql: open feed: %w: the feed reads the binlog over a replication connection of its own and needs the DSN: "+
			"set Config.DSN (ferrymysql.Open sets it; `ferry relay --database-url mysql://…` does)", ferrydriver.ErrMisconfigured)
	}
	var version string
	var logBin int
	var format, image, metadata string
	var serverID int64
	err := d.db.QueryRowContext(ctx, `SELECT @@version, @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, @@server_id`).
		Scan(&version, &logBin, &format, &image, &metadata, &serverID)
	if errNumber(err) == errUnknownSysVar {
		return fmt.Errorf("ferrymysql: open feed: %w: server %s has no binlog_row_metadata: the feed needs MariaDB 10.6 or later (%v)",
			ferrydriver.ErrMisconfigured, version, err)
	}
	if err != nil {
		return d.wrapErr("check the binlog settings", err)
	}
	if !strings.Contains(strings.ToLower(version), "mariadb") {
		return fmt.Errorf("ferrymysql: open feed: %w: server %s is MySQL; the feed supports MariaDB 10.6 and later (it reads the binlog position of a consistent snapshot, which MySQL does not give)",
			ferrydriver.ErrMisconfigured, version)
	}
	var problems []string
	if logBin != 1 {
		problems = append(problems, "log_bin is off: start the server with log-bin (log-bin = /var/lib/mysql/binlog in its configuration)")
	}
	if !strings.EqualFold(format, "ROW") {
		problems = append(problems, "binlog_format is "+format+": set binlog_format = ROW")
	}
	if !strings.EqualFold(image, "FULL") {
		problems = append(problems, "binlog_row_image is "+image+": set binlog_row_image = FULL")
	}
	if !strings.EqualFold(metadata, "FULL") {
		problems = append(problems, "binlog_row_metadata is "+metadata+": set binlog_row_metadata = FULL (the feed reads columns by name)")
	}
	if serverID == 0 {
		problems = append(problems, "server_id is 0: set server_id to a number unique among the servers of the replication topology")
	}
	if len(problems) > 0 {
		return fmt.Errorf("ferrymysql: open feed: %w: the server's binlog cannot be read by the feed: %s (in the [mariadb] section of the server's configuration, then restart it)",
			ferrydriver.ErrMisconfigured, strings.Join(problems, "; "))
	}
	return nil
}
