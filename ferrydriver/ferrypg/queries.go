package ferrypg

// SQL of the outbox, its feeds, checkpoints and leases, request records and
// retention; the inbox's, the parked keys', the dead letters' and the
// partition count's are in the *_queries.go files beside it, the schema in
// migrations/. {schema} is replaced by the quoted schema name when a
// driver is created.

// The append statements are guarded by the schema's stored partition
// count: $11 is the count the producer computed the partitions with, and
// the statement writes nothing (and takes no lock) unless settings holds
// the same count. A statement that wrote nothing raised no error that
// would abort the caller's transaction: the driver then reads the stored
// count (sqlStoredPartitions) and refuses a misconfigured producer, or
// computes the partitions again for one that follows the schema. Reading
// the one-row settings table costs a producer statement about nothing; the
// ACCESS SHARE lock it takes, held to commit, is what SetPartitions'
// TRUNCATE waits for.
//
// Each key's transaction-scoped advisory lock is taken first, held to
// commit, in hash order (so multi-key appends cannot deadlock each other),
// with the transaction's xid; only then are outbox ids drawn. Hence, for
// one key, a writer draws its ids only after the key's previous writer
// committed: id order is commit order, and every row's xid was assigned
// before its id was drawn; the feed depends on both. The lock's class is
// the schema's (hashtext of its quoted name, a constant once planned), its
// object the key's hash: keys whose hashes collide share a lock, which only
// makes their writers wait for each other, and an application's own
// two-argument advisory locks meet these only if it picks the same class.
// No row is written but the outbox's: the relay numbers each key's events
// as it reads them (Seq; ferrydriver.KeySeqStore), so an emit costs about
// what a plain insert costs (docs/benchmarks.md, "Producer cost"). Each
// statement is an INSERT, whose row count says what it wrote.

// sqlAppend writes a batch of events; ORDER BY ord makes ids follow the
// caller's order.
const sqlAppend = appendInput + appendLocks + appendRows + `
  FROM input i, locked
 WHERE locked.n > 0
 ORDER BY i.ord`

// sqlAppendNotify also wakes the relay of each written partition that is
// idle (settings.listening), on the channel "$12.<partition>". NOTIFY is
// delivered at commit, never for a rolled-back transaction.
const sqlAppendNotify = appendInput + appendLocks + `,
woken AS MATERIALIZED (
    SELECT count(pg_notify($12 || '.' || p.partition, ''))
      FROM (SELECT DISTINCT partition FROM input) p, {schema}.settings s
     WHERE s.listening[p.partition + 1] > now()
)` + appendRows + `
  FROM input i, locked, woken
 WHERE locked.n > 0
 ORDER BY i.ord`

const appendInput = `
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::bytea[], $9::timestamptz[], $10::int[])
        WITH ORDINALITY AS t(event_id, topic, key, type, source, content_type, headers,
                             payload, created_at, partition, ord)
)`

// appendLocks takes the keys' locks of a batch, in hash order, and the
// transaction's xid, once the partition guard holds.
const appendLocks = `,
locked AS MATERIALIZED (
    SELECT count(pg_advisory_xact_lock(hashtext('{schema}'), h)) AS n, pg_current_xact_id()
      FROM (SELECT DISTINCT hashtext(key) AS h FROM input
             WHERE EXISTS (SELECT FROM {schema}.settings WHERE partitions = $11::int) ORDER BY 1) hs
)`

const appendRows = `
INSERT INTO {schema}.outbox (partition, event_id, topic, key, seq, type, source,
                             content_type, headers, payload, created_at)
SELECT i.partition, i.event_id, i.topic, i.key, 0,
       i.type, i.source, i.content_type, NULLIF(i.headers, '')::jsonb, i.payload, i.created_at`

// sqlAppendOne is sqlAppend for the common case of one event: no arrays to
// unnest, group and order. It costs PostgreSQL noticeably less CPU per
// producer transaction.
const sqlAppendOne = `
WITH locked AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtext('{schema}'), hashtext($3::text)), pg_current_xact_id()
      FROM {schema}.settings WHERE partitions = $11::int
)` + appendOneRow

const appendOneRow = `
INSERT INTO {schema}.outbox (partition, event_id, topic, key, seq, type, source,
                             content_type, headers, payload, created_at)
SELECT $10::int, $1::uuid, $2::text, $3::text, 0, $4::text, $5::text,
       $6::text, NULLIF($7::text, '')::jsonb, $8::bytea, $9::timestamptz
  FROM locked`

// sqlAppendOneNotify is sqlAppendOne waking the event's partition's relay
// if it is idle, as sqlAppendNotify does, from the settings row the guard
// reads anyway (a table of its own cost an emit 0.15-0.2 PostgreSQL CPU-s
// per 10k: docs/benchmarks.md).
const sqlAppendOneNotify = `
WITH locked AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtext('{schema}'), hashtext($3::text)), pg_current_xact_id(),
           (SELECT pg_notify($12 || '.' || $10::int, '') WHERE listening[$10::int + 1] > now())
      FROM {schema}.settings WHERE partitions = $11::int
)` + appendOneRow

// sqlArmListener tells producers that partition $1's relay is idle until
// now() + $2 ms (settings.listening, which producers read with the
// partition count).
const sqlArmListener = `
UPDATE {schema}.settings
   SET listening[$1::int + 1] = GREATEST(listening[$1::int + 1], now() + $2 * interval '1 millisecond')
 WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL`

// sqlDisarmListener tells producers that the relay is busy again: they
// stop notifying.
const sqlDisarmListener = `
UPDATE {schema}.settings SET listening[$1::int + 1] = now()
 WHERE listening[$1::int + 1] > now() AND set_config('synchronous_commit', 'off', true) IS NOT NULL`

const eventColumns = `id, event_id, topic, key, seq, type, source, content_type, headers::text, payload, created_at`

// sqlReadBatch reads the next events of a feed batch: the rows that became
// visible between the batch's two snapshots, in id order, after $2/$7.
//
// First branch: rows above the previous batch's high id, up to this batch's
// high id, visible at the closing snapshot (xid below its xmax, not in its
// list of running transactions). A range scan of the primary key, O(batch):
//
//	Limit (rows=500)
//	  -> Index Scan using outbox_pkey on outbox
//	       Index Cond: ((partition = 0) AND (id > 1000000) AND (id <= 1000500))
//	       Filter: (xid <> ALL ('{...}'::xid8[]))
//
// so a batch costs the same at the start and the end of a backlog
// (TestFeedBacklogQueryIsFlat; figures in docs/benchmarks.md).
//
// Second branch: rows at or below the previous high id written by
// transactions that were running at the previous snapshot and have finished
// since ("stragglers"); one index probe per straggler on outbox_xid_idx.
const sqlReadBatch = `
SELECT ` + eventColumns + ` FROM (
    (SELECT ` + eventColumns + ` FROM {schema}.outbox
      WHERE partition = $1 AND id > $2 AND id <= $3
        AND xid < $6::text::xid8 AND xid <> ALL ($4::text[]::xid8[])
      ORDER BY id LIMIT $5)
    UNION ALL
    (SELECT o.* FROM unnest($7::text[]::xid8[]) AS s(x)
      CROSS JOIN LATERAL (
        SELECT ` + eventColumns + ` FROM {schema}.outbox
         WHERE xid = s.x AND partition + 0 = $1 AND id > $8 AND id <= $9
         ORDER BY id LIMIT $5) o)
) b ORDER BY id LIMIT $5`

// sqlTickRead closes a new batch at the statement's own snapshot and reads
// its first rows, in one round trip. The first row is a header (k = 0) with
// the snapshot, the highest visible id and the late transactions; event rows
// follow (k = 1). Because the rows are read at the closing snapshot itself,
// visibility does the filtering: every row returned committed before it.
//
// $1 partition, $2 limit, $3 Low (the previous high id), $4 the previous
// snapshot's xmax, $5 the previous snapshot's running transactions.
//
// Late transactions have an xid at or above the previous xmax (so they were
// invisible to the previous snapshot without being listed in its xip: xmax
// is latestCompletedXid+1, not the next xid) and wrote rows at or below Low.
// Finding them scans outbox_xid_idx over the xids started since the
// previous snapshot: O(batch).
//
// The statement is planned once, possibly while the outbox is empty, and
// the planner then sees every index as equally cheap. Its shape leaves one
// sensible index per part whatever the statistics say: the highest id is
// "ORDER BY id DESC LIMIT 1" (only outbox_pkey gives that order; max(id)
// was planned as a full scan of outbox_xid_idx), and the late scan's "id +
// 0" and "partition + 0" keep it off outbox_pkey, whose full scan it
// otherwise chose. Both were O(outbox) per batch: 4–10 ms at 8,000 rows in
// the side-by-side bench (see TestFeedPlansOnAnEmptyOutbox).
const sqlTickRead = `
WITH h AS MATERIALIZED (
    SELECT pg_current_snapshot() AS snap,
           COALESCE((SELECT id FROM {schema}.outbox WHERE partition = $1 ORDER BY id DESC LIMIT 1), 0) AS high
), late AS MATERIALIZED (
    SELECT COALESCE(array_agg(DISTINCT xid), '{}') AS xids FROM {schema}.outbox
     WHERE $3::bigint > 0 AND xid >= $4::text::xid8 AND partition + 0 = $1 AND id + 0 <= $3::bigint
), b AS (
    (SELECT ` + eventColumns + ` FROM {schema}.outbox
      WHERE partition = $1 AND id > $3::bigint AND id <= (SELECT high FROM h) ORDER BY id LIMIT $2)
    UNION ALL
    (SELECT o.* FROM unnest($5::text[]::xid8[] || (SELECT xids FROM late)) AS s(x)
      CROSS JOIN LATERAL (
        SELECT ` + eventColumns + ` FROM {schema}.outbox
         WHERE xid = s.x AND partition + 0 = $1 AND id <= $3
         ORDER BY id LIMIT $2) o)
)
SELECT * FROM (
    SELECT 0 AS k, h.snap::text AS snap, h.high, array_to_string((SELECT xids FROM late), ',') AS late,
           0::bigint AS id, '00000000-0000-0000-0000-000000000000'::uuid, '', '', 0::bigint, '', '', '',
           NULL::text, ''::bytea, now()
      FROM h
    UNION ALL
    (SELECT 1, NULL, NULL, NULL, ` + eventColumns + ` FROM b ORDER BY id LIMIT $2)
) r ORDER BY k, id`

// sqlSeqCache reads the outbox sequence's cache size; it must be 1.
const sqlSeqCache = `
SELECT cache_size FROM pg_sequences WHERE schemaname = $1 AND sequencename = 'outbox_id_seq'`

const sqlLoadCheckpoint = `
SELECT cursor, term, updated_at FROM {schema}.checkpoints WHERE feed = $1`

// sqlSaveCheckpoint is fenced: the lease row is share-locked, so a
// concurrent take-over either waits for this write or makes it match no row.
// The bookkeeping commit is asynchronous: losing it in a database crash only
// means redelivery, which the at-least-once contract allows.
const sqlSaveCheckpoint = `
INSERT INTO {schema}.checkpoints AS c (feed, cursor, term, updated_at, partition)
SELECT $1, $2, $4, now(), $5
 WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL
   AND EXISTS (SELECT 1 FROM {schema}.leases
                WHERE name = $1 AND holder = $3 AND term = $4 AND expires_at > now()
                FOR SHARE)
ON CONFLICT (feed) DO UPDATE SET cursor = excluded.cursor, term = excluded.term, updated_at = now()`

// sqlSaveCheckpointSeqs is sqlSaveCheckpoint with the keys' last Seqs the
// relay gave up to the cursor ($6 keys, $7 numbers), written only if the
// checkpoint is: both or neither, in one statement.
const sqlSaveCheckpointSeqs = `
WITH c AS (` + sqlSaveCheckpoint + `
    RETURNING 1
),
s AS (
    INSERT INTO {schema}.feed_seqs AS s (feed, key, seq, touched_at)
    SELECT $1, u.key, u.seq, now() FROM unnest($6::text[], $7::bigint[]) AS u(key, seq)
     WHERE EXISTS (SELECT FROM c)
    ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, touched_at = excluded.touched_at
)
SELECT count(*) FROM c`

// sqlLoadKeySeqs reads the last Seqs of keys $2 saved with feed $1's
// checkpoint: one probe of the primary key per key.
const sqlLoadKeySeqs = `
SELECT key, seq FROM {schema}.feed_seqs WHERE feed = $1 AND key = ANY($2::text[])`

const leaseColumns = `name, holder, term, expires_at, now()`

const sqlAcquireLease = `
WITH up AS (
    INSERT INTO {schema}.leases AS l (name, holder, term, expires_at)
    VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond')
    ON CONFLICT (name) DO UPDATE SET
        holder = excluded.holder,
        term = CASE WHEN l.holder = excluded.holder AND l.expires_at > now() THEN l.term ELSE l.term + 1 END,
        expires_at = excluded.expires_at
    WHERE l.holder = excluded.holder OR l.expires_at <= now()
    RETURNING ` + leaseColumns + `
)
SELECT * FROM up
UNION ALL
SELECT ` + leaseColumns + ` FROM {schema}.leases WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM up)`

const sqlRenewLease = `
UPDATE {schema}.leases SET expires_at = now() + $4 * interval '1 millisecond'
 WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > now()
RETURNING ` + leaseColumns

const sqlReleaseLease = `
UPDATE {schema}.leases SET expires_at = now() - interval '1 millisecond'
 WHERE name = $1 AND holder = $2 AND term = $3`

const sqlGetLease = `SELECT ` + leaseColumns + ` FROM {schema}.leases WHERE name = $1`

// sqlDeleteDelivered removes delivered events: at or below the previous
// batch's high id and visible to the previous snapshot (a row of a
// transaction that was still running then may not be delivered yet), older
// than the retention. It looks at the $5 oldest rows only, so each call is
// O($5) however many young rows are retained:
//
//	Delete on outbox
//	  -> Nested Loop
//	       -> Subquery Scan on s  Filter: ((created_at < ...) AND (xid < ...) AND (xid <> ALL (...)))
//	            -> Limit -> Index Scan using outbox_pkey on outbox  Index Cond: ((partition = 0) AND (id <= 1000))
//	       -> Index Scan using outbox_pkey on outbox  Index Cond: ((partition = 0) AND (id = s.id))
const sqlDeleteDelivered = `
DELETE FROM {schema}.outbox o USING (
    SELECT id FROM (
        SELECT id, xid, created_at FROM {schema}.outbox
         WHERE partition = $1 AND id <= $2 ORDER BY id LIMIT $5) h
     WHERE h.created_at < now() - $4 * interval '1 millisecond'
       AND h.xid < $6::text::xid8 AND h.xid <> ALL ($3::text[]::xid8[])) s
 WHERE o.partition = $1 AND o.id = s.id`

// sqlPruneKeySeqs forgets the saved numbers of feed $1's keys that no save
// touched for $4 ms, but those of $5, among the next $3 keys after $2 in
// primary-key order: O($3), however many keys there are. The DELETE
// re-checks touched_at on the row's newest version, so a key saved while
// it runs stays. It returns the chunk's last key and size, and the keys
// forgotten.
const sqlPruneKeySeqs = `
WITH chunk AS (
    SELECT key FROM {schema}.feed_seqs WHERE feed = $1 AND key > $2 ORDER BY key LIMIT $3
),
gone AS (
    DELETE FROM {schema}.feed_seqs s USING chunk c
     WHERE s.feed = $1 AND s.key = c.key
       AND s.touched_at < now() - $4 * interval '1 millisecond' AND s.key <> ALL ($5::text[])
    RETURNING s.key
)
SELECT (SELECT max(key) FROM chunk), (SELECT count(*) FROM chunk), (SELECT coalesce(json_agg(key), '[]')::text FROM gone)`

// sqlFeedLag measures the lag of a feed position for the relay's
// heartbeat, O($3) whatever the backlog: it counts the first $3 events
// above the position and reads the partition's highest id ("ORDER BY id
// DESC LIMIT 1": only outbox_pkey gives that order), from which the
// driver extrapolates (driverkit.ExtrapolateLag). It runs in an
// index-plan transaction (inIndexPlanTx), so stale statistics cannot turn
// the bounded range into a sequential scan and a sort. On an outbox
// analysed empty and then loaded with 200,000 rows of lag, 50 buffers and
// 0.4 ms, against 8,770 buffers for the count(*) it replaces
// (TestHeartbeatLagIsBounded):
//
//	Aggregate
//	  InitPlan 1 (returns $0)
//	    -> Limit -> Index Only Scan Backward using outbox_pkey on outbox outbox_1  Index Cond: (partition = 0)
//	  -> Limit (rows=1000) -> Index Scan using outbox_pkey on outbox  Index Cond: ((partition = 0) AND (id > '0'::bigint))
const sqlFeedLag = `
SELECT count(*), COALESCE(max(s.id), 0), min(s.created_at),
       COALESCE((SELECT id FROM {schema}.outbox WHERE partition = $1 ORDER BY id DESC LIMIT 1), 0), now()
  FROM (SELECT id, created_at FROM {schema}.outbox
         WHERE partition = $1 AND id > $2 ORDER BY id LIMIT $3) s`

// sqlFeedLagExact counts every event above a feed position: O(lag), for
// `ferry status --exact` only.
const sqlFeedLagExact = `
SELECT count(*), min(created_at) FROM {schema}.outbox WHERE partition = $1 AND id > $2`

const sqlPartitionCursors = `SELECT cursor FROM {schema}.checkpoints WHERE partition = $1 AND cursor IS NOT NULL`

// Request records (migration 003). A claim inserts the row; a concurrent
// claim of the same ID waits for the first transaction on the primary key
// and then inserts nothing (READ COMMITTED) or fails with a serialization
// failure (REPEATABLE READ, SERIALIZABLE), which RunTx runs again.
const sqlRequestClaim = `INSERT INTO {schema}.requests (id, fingerprint) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`

const sqlRequestFinish = `UPDATE {schema}.requests SET result = $2, finished_at = now() WHERE id = $1`

const sqlRequestGet = `SELECT fingerprint, result, created_at FROM {schema}.requests WHERE id = $1`

const sqlRequestDelete = `
DELETE FROM {schema}.requests WHERE id IN (
    SELECT id FROM {schema}.requests WHERE created_at < now() - $1 * interval '1 millisecond'
     ORDER BY created_at LIMIT $2)`

// sqlLeaseShare fences a relay's writes of parked events and dead letters:
// it holds the feed's lease row, shared, until the transaction ends.
const sqlLeaseShare = `
SELECT 1 FROM {schema}.leases
 WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > now()
 FOR SHARE`

// sqlListLeases reads the leases whose name starts with $1. The leases
// table has a row per feed partition, relay group member and chain group:
// small enough to scan.
const sqlListLeases = `SELECT ` + leaseColumns + ` FROM {schema}.leases
 WHERE left(name, length($1)) = $1 ORDER BY name`

// sqlListFeeds names every feed with a checkpoint, a lease, dead letters
// or parked events: the checkpoints and leases tables (a row per feed
// partition, relay member and chain source), then the distinct feeds of
// the dead letters and of the parked events, each by a skip along its
// primary key (one probe per feed, however many rows it has).
const sqlListFeeds = `
WITH RECURSIVE dl(feed) AS (
    (SELECT feed FROM {schema}.dead_letters ORDER BY feed LIMIT 1)
    UNION ALL
    SELECT (SELECT d.feed FROM {schema}.dead_letters d WHERE d.feed > dl.feed ORDER BY d.feed LIMIT 1)
      FROM dl WHERE dl.feed IS NOT NULL
), pk(feed) AS (
    (SELECT feed FROM {schema}.parked ORDER BY feed LIMIT 1)
    UNION ALL
    SELECT (SELECT p.feed FROM {schema}.parked p WHERE p.feed > pk.feed ORDER BY p.feed LIMIT 1)
      FROM pk WHERE pk.feed IS NOT NULL
)
SELECT feed FROM {schema}.checkpoints
 UNION SELECT name FROM {schema}.leases
 UNION SELECT feed FROM dl WHERE feed IS NOT NULL
 UNION SELECT feed FROM pk WHERE feed IS NOT NULL
 ORDER BY 1`

// sqlOutboxEvents lists outbox events for ferrydriver.OutboxReader (tests of
// what an application emitted): $1 topic, $2 key, $3 type (” any), $4 the
// limit. Not on the feed's path: it reads the outbox in id order.
const sqlOutboxEvents = `
SELECT ` + eventColumns + ` FROM {schema}.outbox
WHERE ($1 = '' OR topic = $1) AND ($2 = '' OR key = $2) AND ($3 = '' OR type = $3)
ORDER BY id LIMIT $4`
