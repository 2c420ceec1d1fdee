// Package ferrymysql is Ferry's MariaDB backend (MySQL's wire and SQL):
// the outbox, written in the application's *sql.Tx, a feed that reads it
// back in commit order from the server's binlog, and the consumer side:
// inboxes, settlement and RunTx.
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
// # What the binlog holds that did not commit
//
// Not everything in the binlog committed. A transaction that changed a
// table that cannot roll back (MyISAM, a temporary table) is written with
// its SAVEPOINT and ROLLBACK TO statements and the rows in between, and is
// written even when it rolls back (its group ends with ROLLBACK); an XA
// transaction is written at XA PREPARE and commits later, if ever. The feed
// holds a transaction's events until it reads the transaction's end,
// leaves out those rolled back to a savepoint, and delivers the rest only
// if the end is a commit; an XA transaction's events are delivered at its
// XA COMMIT (where it commits: its checkpoint keeps the ids of a prepared
// transaction's rows, so a relay started in between still delivers them),
// never after XA ROLLBACK. A transaction's events beyond 10,000 (or 64 MiB
// of payloads) are not held: it is read to its end first, then again. A
// session that writes the binlog as statements (binlog_format =
// STATEMENT) leaves no rows of its outbox writes there: the feed logs an
// error and finds its events by a scan of the outbox (below).
//
// # Delivered once visible
//
// The server writes a transaction to the binlog before InnoDB makes it
// visible to other connections. A Read returns its batch only once its
// last transaction is visible (a shared lock on its last row, which waits
// for the commit; InnoDB makes transactions visible in binlog order), so a
// consumer that reads the producer's database when an event arrives finds
// the event's writes there. It costs a round trip a batch.
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
// and, for the relay's user: GRANT REPLICATION SLAVE, BINLOG MONITOR, PROCESS
// ON *.* (REPLICATION CLIENT before MariaDB 10.5; PROCESS lets the feed read
// INFORMATION_SCHEMA.INNODB_TRX, see Purged binlogs). OpenFeed checks the settings and
// refuses with ferrydriver.ErrMisconfigured, naming the one to change. The
// relay's feed reads the binlog over a replication connection of its own,
// as Config.DSN's user (ferrymysql.Open sets it), with a server id from
// Config.ServerID plus a random offset. MySQL 8 is not supported yet: the
// feed needs the binlog position of a consistent snapshot
// (binlog_snapshot_file), which only MariaDB gives.
//
// # Failover
//
// A checkpoint holds the GTID position (the last transaction of each
// replication domain) beside the binlog file and offset, and the feed
// resumes from the GTID position: a GTID names the same transaction on
// every server of a replication topology, where a file and an offset are
// one server's. After a failover, a relay pointed at the promoted replica
// delivers exactly what came after its checkpoint, provided the replica
// logged what it applied (log_slave_updates = ON) with the settings above.
// A replica that had not received the checkpoint's transactions, or that
// filtered some of them out (replicate_do_db and the like: it has no GTID
// for what it skipped), refuses the position (error 1236): the feed stops
// with an error rather than skip or repeat events, and names what to do
// (point it at a server that has the position, or make it scan the outbox
// from its last delivered event). A checkpoint without a GTID position
// (written before the feed kept one) is resumed from its file and offset,
// on the server that wrote it.
//
// # A stopped leader
//
// A relay's lease transactions (acquire, renew, and the writes fenced on
// the lease: checkpoints, dead letters, parked events) lock the lease's
// row over several round trips. A relay stopped between two of them
// (SIGSTOP, a frozen VM) would keep the row locked for as long as its
// connection lived, and the standby could not take over. They run with
// idle_transaction_timeout = 1 s, set for the transaction only: the server
// ends the stopped relay's connection, which rolls its write back, and the
// standby takes over when the lease expires. The relay finds out that it
// lost the lease when it resumes.
//
// # Purged binlogs
//
// A feed whose saved position is no longer in the binlog (the server
// purged it while no relay read, error 1236) does not lose what was there:
// it scans the outbox table, key by key in Seq order, in a snapshot whose
// binlog position the server gives (START TRANSACTION WITH CONSISTENT
// SNAPSHOT), then follows the binlog from there. The scan starts at the
// start of the oldest transaction that had written rows when the feed read
// its position, among the sessions whose database is the outbox's (the
// feed reads INFORMATION_SCHEMA.INNODB_TRX and PROCESSLIST every second and
// keeps it in the checkpoint), minus Config.RecoveryMargin for the
// server's clock: a producer transaction open for hours is found. The
// exact bound: nothing is lost unless the server's clock went back by more
// than RecoveryMargin, or a session whose current database is another one
// wrote the outbox by its qualified name in a transaction open longer than
// RecoveryMargin. When the relay's user may not read INNODB_TRX
// (GRANT PROCESS ON *.* TO it), the scan starts RecoveryMargin before the
// last event delivered instead (default 5 min), and a producer transaction
// open longer than that whose commit was purged before the relay read it
// is lost; the feed warns once. An XA transaction prepared in the purged
// binlog and committed after the scan began is not delivered: the scan
// logs an error naming it. The scan may publish again events delivered
// before (consumers drop them by ID); an interrupted scan starts over. A
// feed with no saved position starts where the binlog stood when Migrate
// created the outbox, and scans the outbox when that is unknown or
// purged. Retention (DeleteDelivered) keeps what such a scan may need.
//
// A Read returns after at most 100,000 binlog events or a second, whatever
// it found, its cursor past what it read: a relay far behind, catching up
// through other tables' transactions, saves its progress as it goes.
//
// # Consumers: the inbox
//
// The driver is a ferrydriver.Inbox (with InboxBatcher and Transactor): a
// ferry.Consumer runs over it as over PostgreSQL or SQLite.
// A group's events are rows of ferry_inbox, unique on (group, event ID);
// each (group, key) has a row in ferry_inbox_keys saying when its head
// (its oldest unfinished row) may run, and holding its claim, as
// PostgreSQL's and SQLite's: a claim takes each due key's head, and a run
// of the PENDING rows after it, so keys run in parallel and each key in
// order:
//
//   - A claim is one READ COMMITTED transaction. It locks due keys with
//     SELECT … FOR UPDATE SKIP LOCKED, reads their heads afresh, and after
//     each PENDING head its key's next PENDING rows up to the first FAILED
//     one (up to ClaimInboxParams.PerKey: the consumer asks for 32 a
//     worker, or a batch), and records on each key a token of its own, an
//     expiry (ClaimTTL) and the range of positions it covers; the rows are
//     not written (a PENDING or FAILED row inside its key's claim reads as
//     PROCESSING). Workers never wait for each other. The key stays claimed
//     while its worker runs the run, an event a transaction: a finish with
//     CompleteInboxParams.Keep is one statement, the run's last ends the
//     claim and makes the key due, and a failure before the run's end gives
//     the rest back, uncounted. An expired claim's rows count the attempt
//     and run one at a time through rescues.
//   - The handler's writes and the row's PROCESSED commit together:
//     CompleteInboxTx runs in the handler's transaction (RunInTx), changes
//     the row, then ends its key's claim only if the claim is still the
//     key's, unexpired and covering the row (two single-table UPDATEs:
//     MariaDB runs a multi-table one through an on-disk temporary table,
//     and it cost more than the rest of the finish). A stale attempt
//     changes nothing (ferrydriver.ErrClaimLost, and its transaction rolls
//     back). Batches (ConsumerConfig.BatchSize) run each handler in a
//     SAVEPOINT of one transaction and record the outcomes before its
//     commit.
//   - A failure is FAILED until its retry time, or DEAD after MaxAttempts;
//     the group's stored dead policy decides whether a DEAD row holds its
//     key (hold) or lets it go on (continue). Redrive, discard, retention
//     of processed rows, expired-claim rescue and retraction (chain
//     reorgs) are there, as on the other backends.
//   - An ingester reads which of its events the group has and inserts the
//     others, never asking InnoDB to check a duplicate key (whose gap locks
//     deadlock concurrent ingesters); statements that address a key's row
//     use its primary key, and every writer of several keys locks them in
//     key order.
//
// A page of a state's rows (newest first), of a key's, the page after a
// cursor, an event's row and the counts by state (capped at
// ferrydriver.InboxCountCap) each read a range of an index, whatever the
// inbox holds (TestInboxListsReadTheirPageOnly counts the rows the server
// reads). A filter by type is not indexed: the console applies it to the
// pages it reads.
//
// # Settlement
//
// AwaitSettled reads on the pool, one autocommit statement at a time, so a
// caller's open REPEATABLE READ transaction, whose snapshot predates the
// consumer's commit, still gets "settled". It does not poll: one binlog
// reader per driver (a replication connection, as Config.DSN's user, like
// the feed's), started with the first waiter and stopped five seconds
// after the last, follows the changes of ferry_inbox rows and wakes the
// waiters of each row that finished; they read it again, and once more a
// moment later if InnoDB has not made the commit visible yet (the binlog
// is written first). A waiter also reads again every two seconds, as a
// safety net only: when the reader broke (it restarts) or cannot run
// (no DSN, no binlog, no REPLICATION SLAVE grant: a warning says so).
// BenchmarkSettleWakeUp measures the time from a commit to the waiter's
// return.
//
// # RunTx
//
// ferry.RunTx over the driver runs its callback again after a deadlock
// (1213) and after a lock wait timeout (1205, which rolls back only its
// statement: the rest is rolled back before the rerun, never continued).
// A COMMIT whose answer was lost is never run again blindly: with a
// request ID, the request record written in the transaction tells, once
// the session that sent the COMMIT has ended (it is killed if it
// lingers), whether it committed; without one, RunTx returns
// ferry.ErrCommitUnknown. The consumer's RunInTx reruns deadlocks and lock
// wait timeouts the same way, so handlers must have no effect outside
// their transaction. A handler that swallows a deadlock's error must not
// go on: InnoDB rolled its transaction back, and what it runs after that
// commits statement by statement; CompleteInboxTx then refuses to mark the
// event processed.
//
// Stability: the package's API may change until Ferry 1.0; the schema
// changes only through migrations.
package ferrymysql
