package ferrypg

// SQL of the partition count and of what changing it checks: live leases,
// every feed's checkpoint, undelivered events. {schema} is replaced by the
// quoted schema name.

// sqlIndexPlans keeps bitmap and sequential scans out of the rest of a
// transaction's plans (see inIndexPlanTx): the transaction-local form of
// the scan settings feedSettings gives the feed's session.
const sqlIndexPlans = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`

// Partition count (migration 004; see appendGuard and SetPartitions).
const sqlStoredPartitions = `SELECT partitions FROM {schema}.settings`

// sqlLockSettings takes the lock that every producer statement's ACCESS
// SHARE conflicts with: it waits for the producer transactions that read
// the count and holds new ones back until the change commits. lock_timeout
// bounds the wait, which new producers would spend queued behind it.
const sqlLockSettings = `LOCK TABLE {schema}.settings IN ACCESS EXCLUSIVE MODE`

// sqlChangeSettingsTx starts SetPartitions' transaction: READ COMMITTED
// whatever default_transaction_isolation says, so that the checks after
// the lock see every producer transaction it waited for (a REPEATABLE READ
// snapshot could predate them), and a bounded wait for the lock.
const sqlChangeSettingsTx = `SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '` + lockTimeout + `'`

// sqlTruncateSettings empties settings for the new row. TRUNCATE is not
// MVCC-safe, and that is why it is used: a REPEATABLE READ producer whose
// snapshot predates the change sees no row at all, not the old count, so
// its append writes nothing and asks for the transaction to run again.
const sqlTruncateSettings = `TRUNCATE {schema}.settings`

const sqlInsertSettings = `INSERT INTO {schema}.settings (partitions) VALUES ($1)`

// sqlLiveLeases lists the leases that have not expired (relays' and
// others'; SetPartitions keeps the relays' by name).
const sqlLiveLeases = `
SELECT name, holder, extract(epoch FROM expires_at - now())::float8 FROM {schema}.leases
 WHERE expires_at > now() ORDER BY name`

const sqlAllCheckpoints = `SELECT feed, partition, cursor FROM {schema}.checkpoints ORDER BY feed`

// sqlHighestPartition is the highest partition with an event, or -1: the
// last entry of outbox_pkey.
const sqlHighestPartition = `
SELECT COALESCE((SELECT partition FROM {schema}.outbox ORDER BY partition DESC LIMIT 1), -1)`

const sqlPartitionHasEvents = `SELECT EXISTS (SELECT FROM {schema}.outbox WHERE partition = $1)`

// sqlUndelivered counts, up to $8, the events of partition $1 that a feed
// at a given cursor has not delivered (see feedState): every event visible
// to the cursor's base snapshot was delivered ($2 xmax, $3 running xids:
// the current snapshot when the batch is done, $4, else the previous one),
// and so was every event of an unfinished batch at or below After ($5)
// that the current snapshot ($6, $7) sees. The candidates, the events the
// base snapshot does not see, are found through outbox_xid_idx: the
// transactions that started since, and those it saw running. With no
// writer left (SetPartitions holds them back) that is O(events since the
// cursor), not O(outbox); the transaction is planned without sequential
// or bitmap scans (sqlIndexPlans). On a 20,000-row outbox, one event since
// the cursor, 10 buffers (TestPartitionsUndeliveredIsCountedByIndex):
//
//	Aggregate
//	  -> Limit
//	       -> Append
//	            -> Subquery Scan on "*SELECT* 1"
//	                 -> Index Only Scan using outbox_xid_idx on outbox
//	                      Index Cond: (xid >= '62860'::xid8)
//	                      Filter: ((partition + 0) = 0)
//	            -> Subquery Scan on "*SELECT* 2"
//	                 -> Index Only Scan using outbox_xid_idx on outbox outbox_1
//	                      Index Cond: ((xid = ANY ('{62855,62856}'::xid8[])) AND (xid < '62860'::xid8))
//	                      Filter: ((partition + 0) = 0)
const sqlUndelivered = `
SELECT count(*) FROM (
    SELECT FROM (
        SELECT id, xid FROM {schema}.outbox
         WHERE xid >= $2::text::xid8 AND partition + 0 = $1
        UNION ALL
        SELECT id, xid FROM {schema}.outbox
         WHERE xid = ANY ($3::text[]::xid8[]) AND xid < $2::text::xid8 AND partition + 0 = $1
    ) c
     WHERE $4 OR c.id > $5 OR NOT (c.xid < $6::text::xid8 AND c.xid <> ALL ($7::text[]::xid8[]))
     LIMIT $8
) u`
