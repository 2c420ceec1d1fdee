// Package ferrymysql is Ferry's MariaDB backend (MySQL's wire and SQL):
// the outbox, written in the application's *sql.Tx, and a feed that reads
// it back in commit order from the server's binlog.
//
// # Use
//
//	db, _ := sql.Open("mysql", dsn)                      // the application's pool
//	drv, err := ferrymysql.New(db, &ferrymysql.Config{DSN: dsn})
//	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{}) // or `ferry migrate up`
//	client, err := ferry.NewClient(drv, nil)
//	tx, _ := db.BeginTx(ctx, nil)
//	// … the application's writes …
//	err = client.EmitTx(ctx, tx, &ferry.Event{Topic: "orders", Key: orderID, Type: "OrderPlaced", Payload: body})
//	err = tx.Commit() // the event commits or rolls back with the writes
//
// Ferry's tables (ferry_*) live in the pool's database. Times are stored as
// microseconds since the epoch, from the server's clock, and text as bytes:
// no DSN parameter (parseTime, loc, collation) changes what is stored.
//
// # Order without skipping, without stalling
//
// An append takes its key's next sequence numbers under the lock of the
// key's row in ferry_keys, held to commit: two writers of one key
// serialise, and the first to commit has the lower numbers. The feed reads
// the binlog, where the server writes each transaction whole when it
// commits, in commit order: a transaction that drew its ids early and
// committed late is read where it committed (a poller of "id > last" skips
// it), a transaction held open elsewhere writes nothing there until it
// commits (so nothing waits for it), and a key's writers are read in the
// order they committed. The behavioural suite (ferrydrivertest) checks the
// three: LateCommitterIsNotSkipped, LongWriterDoesNotStall,
// PerKeyCommitOrder.
//
// # What the server needs
//
// MariaDB 10.6 or later, configured with:
//
//	[mariadb]
//	log-bin              = binlog   # the binlog on
//	binlog_format        = ROW
//	binlog_row_image     = FULL
//	binlog_row_metadata  = FULL     # the feed reads columns by name
//	server_id            = 1        # unique among the topology's servers
//	binlog_expire_logs_seconds = 604800  # longer than any relay outage you plan for
//
// and, for the relay's user: GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.*
// (REPLICATION CLIENT before MariaDB 10.5). OpenFeed checks the settings and
// refuses with ferrydriver.ErrMisconfigured, naming the one to change. The
// relay's feed reads the binlog over a replication connection of its own,
// as Config.DSN's user (ferrymysql.Open sets it), with a server id from
// Config.ServerID plus a random offset. MySQL 8 is not supported yet: the
// feed needs the binlog position of a consistent snapshot
// (binlog_snapshot_file), which only MariaDB gives.
//
// # Purged binlogs
//
// A feed whose saved position is no longer in the binlog (the server
// purged it while no relay read, error 1236) does not lose what was there:
// it scans the outbox table, key by key in Seq order, from its last
// acknowledged event minus Config.RecoveryMargin (longer than any producer
// transaction stays open), in a snapshot whose binlog position the server
// gives (START TRANSACTION WITH CONSISTENT SNAPSHOT), then follows the
// binlog from there. It may publish again the events acknowledged within
// the margin (consumers drop them by ID); an interrupted scan starts over.
// A feed with no saved position starts where the binlog stood when Migrate
// created the outbox, and scans the outbox when that is unknown or purged.
// Retention (DeleteDelivered) keeps what such a scan may need.
//
// Stability: the package's API may change until Ferry 1.0; the schema
// changes only through migrations.
package ferrymysql
