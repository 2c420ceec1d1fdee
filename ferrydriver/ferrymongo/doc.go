// Package ferrymongo is Ferry's MongoDB backend, on the official driver
// (go.mongodb.org/mongo-driver/v2). Work in progress: the outbox, its
// change-stream feed with recovery, leases, checkpoints, dead letters,
// retention, the consumer inbox, settlement (a change stream on the inbox)
// and the RunTx transactor are written, but have not yet run against a
// real server. See "How it is verified" below before relying on it.
//
// # Requirements
//
// A replica set or a sharded cluster: change streams and transactions do
// not exist on a standalone mongod, and New refuses one, saying how to fix
// it. For development a single-node replica set is enough:
//
//	mongod --replSet rs0 --dbpath /var/lib/mongodb
//	mongosh --eval 'rs.initiate()'
//
// # Emitting
//
// Events are written in the caller's session transaction with
// majority write concern; the transaction type is the context.Context that
// Session.WithTransaction passes to its callback:
//
//	_, err := sess.WithTransaction(ctx, func(tx context.Context) (any, error) {
//		if _, err := orders.InsertOne(tx, order); err != nil {
//			return nil, err
//		}
//		return nil, client.EmitTx(ctx, tx, ev)
//	})
//
// Each event takes its key's next sequence number from the keys
// collection in the same transaction, so producers of one key conflict
// (WriteConflict, labelled TransientTransactionError: WithTransaction runs
// the callback again) and producers of different keys never do. The
// relay's PruneKeys forgets a key once it has been idle for KeyRetention and
// none of its events is left in the outbox (the recovery scan orders a
// key's events by sequence number, so a restarted key must not meet its old
// ones); a producer that re-creates it concurrently conflicts and runs again.
//
// # The feed
//
// The feed is a change stream on the outbox collection: inserts of its
// partition, never projected (the driver resumes from each change's _id).
// Its position is the resume token after the last event read, saved by the
// relay only once the sink acknowledged the batch, and on a quiet outbox
// the postBatchResumeToken, so that the saved position never ages out of
// the oplog while nothing happens. The stream is opened with startAfter,
// which also crosses an invalidate (the outbox dropped or renamed).
//
// When the oplog no longer holds the saved position (ChangeStreamHistoryLost,
// an invalid token), nothing is skipped silently: the feed takes the
// current cluster time, publishes every event of the partition created
// since the last acknowledged one minus Config.RecoveryMargin (longer than
// MongoDB's transaction lifetime limit plus clock skew), per key in
// sequence order, and then opens a new stream at that cluster time. Events
// committed during the scan come twice; consumers deduplicate by event ID.
// Retention (the relay's DeleteDelivered) never removes events a feed
// might need for such a scan.
//
// # Retention
//
// The relay's retention (DeleteDelivered) removes only events every feed
// of the partition has passed, minus the recovery margin. Config.RetentionTTL
// adds a TTL index that removes events by age alone; Migrate creates it,
// changes it in place or drops it to match the setting. Either must keep
// events longer than the oplog window plus Config.OutageAllowance, or a
// recovery scan could find them gone: CheckRetention (run by `ferry run`)
// warns when it does not. A capped outbox is not offered: MongoDB does not
// allow writes to capped collections inside transactions.
//
// # Capture mode (no outbox)
//
// Driver.Capture returns a Store whose feed relays the changes of business
// collections instead of the outbox, through one database-level change
// stream over the collections named (or every collection but Ferry's own),
// with optional post-images (updateLookup, or the recorded image) and
// pre-images (MongoDB 6.0+, changeStreamPreAndPostImages, which
// Capture.EnableImages turns on). Each change becomes an event: topic from
// the collection, key from the document's _id, type "mongodb.<operation>",
// a JSON payload with the images and update description, and an ID derived
// from the resume token, so that a change read twice keeps its ID. It is
// off by default because it gives up what the outbox guarantees: events
// follow the schema rather than the producer's intent, Seq is 0, and lost
// oplog history cannot be recovered; the feed stops with an error saying
// so unless CaptureConfig.ResumeFromNowOnHistoryLost accepts the gap.
//
// # Partitions
//
// The outbox can be split by key hash (ferrydriver.PartitionOf) into
// partitions, one relay each. The count is stored in <Prefix>meta by
// Migrate (Config.Partitions, or the count an existing outbox uses, or 1)
// and enforced by the outbox collection's validator: every event carries
// the count its partition was computed with, and an insert with another
// one fails, aborting the producer's transaction before it commits. This
// costs producers no round trip: a driver reads the count once. One with
// Config.Partitions 0 follows it: when its insert is refused it reads the
// count again and reports a TransientTransactionError, so that
// WithTransaction and ferry.RunTx run the transaction again. One with
// another value is refused (ferrydriver.ErrMisconfigured), as is a feed of
// another count or of a partition out of range. Change the count with
// Driver.SetPartitions (`ferry partitions set N`) once the relays have
// delivered everything and stopped: it refuses otherwise, since a key whose
// partition changes must have nothing left undelivered in the old one.
// While it checks, the validator refuses every event; if it is
// interrupted, Migrate sets the validator back to the stored count.
// Migrate and SetPartitions need the collMod privilege.
//
// # Oplog sizing
//
// The oplog must cover the longest relay outage you want to survive
// without a recovery scan: oplog size ≥ oplog GB per hour × hours of
// outage. Check the window with rs.printReplicationInfo().
//
// # Sharded clusters
//
// Keep the outbox collection unsharded: a change stream on one unsharded
// collection is ordered, which per-key order relies on.
//
// # How it is verified
//
// No MongoDB server runs on the machines this project is built on. The
// decisions (resume, recover or fail after a stream error; which token to
// save; rerun, retry the commit or give up in a transaction) are functions
// unit-tested against every rule of the driver specifications. Error paths
// that involve the real driver run against scripted server replies
// (Debian's python3-mockupdb), as does the partition guard: an insert
// refused by the validator run again with the new count, a misconfigured
// producer refused before it writes, Migrate storing the count an old
// outbox uses, SetPartitions refusing while a relay holds a feed. The inbox
// suite, with the conformance table that pins every backend to the inbox
// model, and the transactor suite run on a small server of the tests' own
// (testdata/fakemongo.py: Debian's python3-mongomock evaluating the real
// driver's commands, with MongoDB's write conflicts between transactions
// and change streams, but committed reads where MongoDB reads a snapshot).
// The other behavioural suites (ferrydrivertest, with its partition tests,
// capture on a server), the companies matrix and the relay crash and
// zombie-leader tests in cmd/ferry run only when FERRY_TEST_MONGODB_URL
// names a replica set; they have not been run against a real server yet.
// Nor has the validator's interplay with transactions whose snapshot
// predates a collMod (expected: a transient error, so the transaction runs
// again).
package ferrymongo
