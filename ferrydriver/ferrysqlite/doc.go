// Package ferrysqlite is Ferry's embedded backend: the outbox, relay
// bookkeeping, consumer inboxes and settlement in one SQLite file, on
// modernc.org/sqlite (pure Go, no cgo).
//
// # Opening
//
//	drv, err := ferrysqlite.Open("data/app.db", nil)
//	if err != nil {
//		return err
//	}
//	defer drv.Close()
//	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
//		return err
//	}
//
// The driver owns two handles on the file, in WAL mode: a write handle
// with a single connection (DB), on which every write transaction begins
// IMMEDIATE, and a read handle for feeds, listings and settlement reads.
// Begin the application's transactions on DB and pass them to
// ferry.Client.EmitTx: in-process writers then queue for the connection
// instead of failing with SQLITE_BUSY. Inside a transaction, use the
// transaction for every statement; another statement on DB from the same
// goroutine would wait for the transaction it is part of.
//
// # Commit order
//
// SQLite has one writer at a time, and a writer holds the lock from its
// first write to its commit, so outbox ids (AUTOINCREMENT, never reused) are
// drawn in commit order. The feed reads "id > position" and can neither skip
// a late committer nor stall behind a long one: neither can exist. Per-key
// sequence numbers come from a keys table updated in the same transaction,
// gapless because a rollback undoes them too; PruneKeys forgets a key whose
// newest event every feed has passed once it has been idle long enough (see
// ferryevent.Event.Seq). The capability
// ConcurrentWriters is false and the driver suite says so.
//
// # Wake-ups
//
// Commits made through this driver wake a waiting feed and AwaitSettled
// callers at once. Other processes writing the same file are noticed
// through PRAGMA data_version, which a waiting feed reads every 20 ms, and
// by AwaitSettled reading the awaited events again every second.
//
// # Partitions
//
// The outbox can be split by key hash (ferrydriver.PartitionOf) into
// partitions, one relay each. The count is stored in the database
// (ferry_settings, migration 004), and every append reads it in its write
// transaction: a driver with Config.Partitions 0 writes by it, one with
// another value is refused (ferrydriver.ErrMisconfigured) when it differs,
// and so is a feed of a partition outside it. Change it with
// Driver.SetPartitions (`ferry partitions set N`) once the relays have
// delivered everything and stopped; it refuses otherwise, since a key whose
// partition changes must have nothing left undelivered in the old one.
//
// Times are stored as microseconds since the Unix epoch; leases and claims
// use the host's clock, shared by every process that can open the file.
package ferrysqlite
