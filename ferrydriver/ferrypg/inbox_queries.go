package ferrypg

// SQL of the consumer inbox (migrations 002, 007, 008, 011, 013 and 014). {schema} is
// replaced by the quoted schema name.
//
// The inbox keeps one row per (group, event), written twice: when it is
// received (PENDING) and when its outcome is known (PROCESSED, FAILED,
// DEAD). Claims live on the key's row (inbox_keys, migration 011): a claim
// takes a run of a key's next rows in order, up to a position, with one
// token and one expiry, and the finish that records their outcomes moves
// the key's done_pos past the rows that finished. So an event costs one
// write of its row after ingestion, and a run of a key's events costs two
// writes of the key's row in all. A row inside a live claim's range reads
// as PROCESSING (inboxClaimed).
//
// Lock order, everywhere: inbox rows first, then key rows in key order.
// Ingestion inserts its rows and then upserts their keys (in key order); a
// finish updates its rows and then locks its keys (in key order); a
// retraction locks its rows (in event order) and then its keys. The
// statements that start from a key (a claim whose row's attempts are
// spent, a rescue) take the rows they change with SKIP LOCKED, never
// waiting for one, and leave a row that another transaction holds for
// later.

// sqlInboxInsert records events once per (group, event ID) and makes the
// keys that had nothing to do runnable. It raises each key's tail_pos
// under the key's row lock, so that a finish, which locks the key too,
// reads whether more rows came for it whatever its snapshot saw; a row
// that landed at or below a key's done_pos (two deliveries of one key
// racing) lowers done_pos to come before it, so that it is not passed
// over, and one that landed inside a live claim's range (its position
// taken before the claim's rows, its commit after the claim read them)
// marks the claim (claim_dirty: see keyLowered). It updates the row of every key it inserted for, so that a finish
// running under REPEATABLE READ or SERIALIZABLE (Config.InboxIsolation)
// whose snapshot misses the new rows fails to update the key with a
// serialization failure, and runs again, instead of marking the key idle
// with rows left in it.
const sqlInboxInsert = inboxInsertRows + `, keys AS (
    INSERT INTO {schema}.inbox_keys AS k (group_name, key, runnable_at, tail_pos, done_pos)
    SELECT $1, key, now(), max(pos), min(pos) - 1 FROM ins GROUP BY key ORDER BY key
    ON CONFLICT (group_name, key) DO UPDATE
       SET tail_pos = greatest(k.tail_pos, excluded.tail_pos),
           done_pos = least(k.done_pos, excluded.done_pos),
           claim_dirty = k.claim_dirty OR (k.claim_token IS NOT NULL AND excluded.done_pos < k.claim_through),
           runnable_at = CASE WHEN ` + keyIdle + ` THEN now() ELSE k.runnable_at END
    RETURNING 1
)
SELECT event_id FROM ins`

// sqlInboxInsertClaim is sqlInboxInsert that also claims
// (InsertInboxClaim), for worker $13 under the token $12 until $14 ms from
// now, the new rows of each key that was idle: nothing unfinished up to
// its tail, no claim, no hold, no rescue due, not runnable (a key that
// has rows to run keeps them in order behind those). Up to $15 such keys,
// in key order, get the claim, through their $16-th new row at most; a
// key that is new gets it in the row inserted for it. Each new row comes
// back, by key and then position, with whether it was claimed. A claimed
// key is left as a claim leaves it (not runnable, due for a rescue when
// the claim expires), and its finish makes it runnable again if rows are
// left beyond the claim.
// The claim's rows may be lowered into by a racing delivery just as a
// claim's (claim_dirty, keyLowered).
const sqlInboxInsertClaim = inboxInsertRows + `, nk AS MATERIALIZED (
    SELECT key, min(pos) AS first, max(pos) AS tail,
           (array_agg(pos ORDER BY pos))[LEAST(count(*), $16::int)] AS through,
           row_number() OVER (ORDER BY key) <= $15::int AS may
      FROM ins GROUP BY key
), keys AS (
    INSERT INTO {schema}.inbox_keys AS k (group_name, key, runnable_at, tail_pos, done_pos,
                                         claim_token, claimed_by, claim_from, claim_through, claim_expires_at, rescue_at)
    SELECT $1, key, CASE WHEN may THEN NULL ELSE now() END, tail, first - 1,
           CASE WHEN may THEN $12::uuid END, CASE WHEN may THEN $13::text END, CASE WHEN may THEN first - 1 END,
           CASE WHEN may THEN through END,
           CASE WHEN may THEN now() + $14 * interval '1 millisecond' END, CASE WHEN may THEN now() + $14 * interval '1 millisecond' END
      FROM nk ORDER BY key
    ON CONFLICT (group_name, key) DO UPDATE
       SET tail_pos = greatest(k.tail_pos, excluded.tail_pos),
           done_pos = least(k.done_pos, excluded.done_pos),
           claim_dirty = CASE WHEN ` + ingestClaims + ` THEN false
                              ELSE k.claim_dirty OR (k.claim_token IS NOT NULL AND excluded.done_pos < k.claim_through) END,
           claim_token = CASE WHEN ` + ingestClaims + ` THEN excluded.claim_token ELSE k.claim_token END,
           claimed_by = CASE WHEN ` + ingestClaims + ` THEN excluded.claimed_by ELSE k.claimed_by END,
           claim_from = CASE WHEN ` + ingestClaims + ` THEN least(k.done_pos, excluded.done_pos) ELSE k.claim_from END,
           claim_through = CASE WHEN ` + ingestClaims + ` THEN excluded.claim_through ELSE k.claim_through END,
           claim_expires_at = CASE WHEN ` + ingestClaims + ` THEN excluded.claim_expires_at ELSE k.claim_expires_at END,
           rescue_at = CASE WHEN ` + ingestClaims + ` THEN excluded.rescue_at ELSE k.rescue_at END,
           runnable_at = CASE WHEN ` + keyIdle + ` AND NOT ` + ingestClaims + ` THEN now() ELSE k.runnable_at END
    RETURNING k.key, k.claim_token IS NOT DISTINCT FROM $12::uuid AS mine, k.claim_through
)
SELECT ins.event_id, COALESCE(c.mine AND ins.pos <= c.claim_through, false)
  FROM ins LEFT JOIN keys c ON c.key = ins.key
 ORDER BY ins.key, ins.pos`

// inboxInsertRows inserts the rows of a delivery ($1 the group, $2..$11
// the events' columns) once per event ID; ins holds those it inserted.
const inboxInsertRows = `
WITH input AS (
    SELECT * FROM unnest($2::uuid[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[],
                         $8::text[], $9::text[], $10::bytea[], $11::timestamptz[])
        WITH ORDINALITY AS t(event_id, key, seq, topic, type, source, content_type, headers, payload, created_at, ord)
), ins AS (
    INSERT INTO {schema}.inbox (group_name, event_id, key, seq, topic, type, source, content_type, headers, payload, created_at)
    SELECT $1, event_id, key, seq, topic, type, source, content_type, NULLIF(headers, '')::jsonb, payload, created_at
      FROM input ORDER BY ord
    ON CONFLICT (group_name, event_id) DO NOTHING
    RETURNING event_id, key, pos
)`

// keyIdle says whether the key row k (before an ingest's upsert) is
// neither runnable, nor claimed, held or due for a rescue: an ingest makes
// it runnable.
const keyIdle = `(k.runnable_at IS NULL AND k.held_by IS NULL AND k.claim_token IS NULL AND k.rescue_at IS NULL)`

// ingestClaims says whether sqlInboxInsertClaim's upsert claims key k:
// idle with every row up to its tail finished, and one that may be
// claimed (excluded.claim_token).
const ingestClaims = `(` + keyIdle + ` AND k.done_pos >= k.tail_pos AND excluded.claim_token IS NOT NULL)`

// holdDead is the dead policy stored for the group $1 (SetInboxPolicy), the
// only one: true (Hold) when none is. It is evaluated once per statement.
const holdDead = `COALESCE((SELECT hold_dead FROM {schema}.inbox_groups WHERE group_name = $1), true)`

// unfinishedAfter is the condition on an inbox row i of a key's queue:
// not finished (a DEAD row counts when the group holds keys behind dead
// rows). It names the states as literals, so that inbox_unfinished_idx
// (key, group_name, pos) serves it.
const unfinishedAfter = `i.state IN ('pending', 'failed', 'dead') AND (i.state <> 'dead' OR ` + holdDead + `)`

// inboxRowColumns are the columns scanInboxRow reads, of an inbox row i
// and cl.claimed (inboxClaimed): a claimed row reads as PROCESSING, its
// attempt counted. The row's state is tested again beside cl.claimed: a
// read FOR SHARE that waited for a finisher's lock gets the row's new
// version, but cl as computed from the old one (PostgreSQL re-evaluates
// only the locked row), and a row finished under a claim must read as
// finished (AwaitSettled's first read depends on it).
const inboxRowColumns = `i.event_id, i.key, i.seq, i.topic, i.type, i.source, i.content_type, i.headers::text, i.payload, i.created_at,
       CASE WHEN cl.claimed AND i.state IN ('pending', 'failed') THEN 'processing' ELSE i.state END,
       i.attempts + (cl.claimed AND i.state IN ('pending', 'failed'))::int,
       COALESCE(i.last_error, ''), i.next_attempt_at, i.received_at, COALESCE(i.finished_at, 'epoch')`

// inboxClaimed joins an inbox row i to cl.claimed: whether the row is
// inside its key's claim (one that expired included: its rows are
// PROCESSING until a rescue takes them). Only a PENDING or FAILED row can
// be, and only for those is the key looked up (a page of DEAD rows costs
// no lookup).
const inboxClaimed = `
 CROSS JOIN LATERAL (SELECT CASE WHEN i.state IN ('pending', 'failed') THEN EXISTS (
        SELECT 1 FROM {schema}.inbox_keys c
         WHERE c.key = i.key AND c.group_name = i.group_name AND c.claim_token IS NOT NULL
           AND i.pos > c.claim_from AND i.pos <= c.claim_through) ELSE false END AS claimed OFFSET 0) cl`

// sqlInboxClaim claims runs of keys' rows: the keys ($2 at most) whose
// runnable_at has come, oldest first, locked with SKIP LOCKED, and of each
// its first unfinished rows above done_pos ($8 at most), up to the first
// that cannot run now (a FAILED row not yet due, a DEAD row holding the
// key, a row whose attempts are spent): a PENDING head and the PENDING
// rows after it, or a FAILED head that is due alone; $9 rows at most in
// all. Each key
// claimed gets the claim ($5, for worker $3, expiring in $4 ms), no longer
// runnable but due for a rescue when the claim expires. A key's first row
// whose attempts ($6 > 0) are spent goes DEAD with the reason $7 instead,
// and its key follows the group's stored policy. A key locked with nothing
// to claim and nothing spent is returned as 'idle': the caller recomputes
// it (refreshKeys), since this statement's snapshot may predate rows its
// lock waited for. Its commit is asynchronous: a claim lost in a crash
// only means the rows run again.
//
// Each key's claim is written through the key row's ctid as the lock
// returned it, so that the update reads that row only whatever the plan
// (a join on the key was planned, while the statistics said the group was
// small, as a scan of the group's every key). The lock returns the key's
// newest version: when a transaction that committed after this
// statement's snapshot had updated the key (an ingest raising tail_pos),
// that version is not visible to the update, which then skips it. Such a
// key's rows (lost) are not returned: nothing of the claim was written, the
// key is still runnable, and the next claim takes it.
//
// Each row comes with what became of it: 'claimed' (ordered by key, then
// position), 'dead', or 'idle' (only the key is meaningful).
var sqlInboxClaim = `
WITH k AS (
    SELECT key, done_pos, runnable_at AS k_at, ctid AS ktid FROM {schema}.inbox_keys
     WHERE group_name = $1 AND runnable_at <= now()
       AND set_config('synchronous_commit', 'off', true) IS NOT NULL
     ORDER BY runnable_at LIMIT $2
     FOR UPDATE SKIP LOCKED
), r AS MATERIALIZED (
    SELECT k.key, k.k_at, k.ktid, i.tid, i.event_id, i.pos, i.state, i.attempts, i.next_attempt_at,
           (i.state = 'pending' OR (i.state = 'failed' AND i.next_attempt_at <= now())) AND NOT ($6 > 0 AND i.attempts >= $6) AS ok
      FROM k CROSS JOIN LATERAL (
        SELECT i.ctid AS tid, i.event_id, i.pos, i.state, i.attempts, i.next_attempt_at FROM {schema}.inbox i
         WHERE i.key = k.key AND i.group_name = $1 AND i.pos > k.done_pos AND ` + unfinishedAfter + `
         ORDER BY i.pos LIMIT $8) i
), runs AS MATERIALIZED (
    SELECT q.*, row_number() OVER (ORDER BY q.k_at, q.key, q.pos) AS n
      FROM (SELECT r.*, bool_and(r.ok) OVER w AND (row_number() OVER w = 1 OR bool_and(r.state = 'pending') OVER w) AS run
              FROM r WINDOW w AS (PARTITION BY r.key ORDER BY r.pos)) q
     WHERE q.run
), p AS MATERIALIZED (
    SELECT * FROM runs WHERE runs.n <= $9
), spent AS (
    UPDATE {schema}.inbox i
       SET state = 'dead', finished_at = now(),
           last_error = $7 || COALESCE(' (last recorded error: ' || NULLIF(i.last_error, '') || ')', ''),
           attempt_log = ` + logAttempt("i.attempts", "'dead'", "$7") + `
      FROM (SELECT DISTINCT ON (r.key) r.* FROM r ORDER BY r.key, r.pos) h
     WHERE i.group_name = $1 AND i.event_id = ANY ((SELECT array_agg(r.event_id) FROM r)::uuid[]) AND i.ctid = h.tid AND i.event_id = h.event_id
       AND $6 > 0 AND h.attempts >= $6 AND (h.state = 'pending' OR (h.state = 'failed' AND h.next_attempt_at <= now()))
       -- The key is locked already: a row another transaction holds (a
       -- retraction, which waits for the key next) is left for later.
       AND i.ctid = ANY (ARRAY(SELECT l.ctid FROM {schema}.inbox l
                                WHERE l.group_name = $1 AND l.event_id = ANY ((SELECT array_agg(r.event_id) FROM r WHERE $6 > 0 AND r.attempts >= $6)::uuid[])
                                  FOR UPDATE SKIP LOCKED))
    RETURNING i.*
), claimed AS (
    UPDATE {schema}.inbox_keys ik
       SET claim_token = $5::uuid, claim_dirty = false, claimed_by = $3, claim_from = ik.done_pos, claim_through = c.through,
           claim_expires_at = now() + $4 * interval '1 millisecond', rescue_at = now() + $4 * interval '1 millisecond',
           runnable_at = NULL
      FROM (SELECT p.key, p.ktid, max(p.pos) AS through FROM p GROUP BY p.key, p.ktid) c
     WHERE ik.ctid = c.ktid AND ik.group_name = $1 AND ik.key = c.key
    RETURNING ik.key
), lost AS (
    SELECT DISTINCT p.key FROM p WHERE p.key NOT IN (SELECT ck.key FROM claimed ck)
), spent_keys AS (
    -- Hold: the dead row holds its key; Continue: the key moves past it.
    UPDATE {schema}.inbox_keys ik
       SET held_by = CASE WHEN ` + holdDead + ` THEN x.event_id END,
           done_pos = CASE WHEN ` + holdDead + ` THEN ik.done_pos ELSE x.pos END,
           runnable_at = CASE WHEN NOT ` + holdDead + ` AND ik.tail_pos > x.pos THEN now() END
      FROM spent x WHERE ik.group_name = $1 AND ik.key = ANY ((SELECT array_agg(x.key) FROM spent x)::text[]) AND ik.key = x.key
       AND EXISTS (SELECT FROM spent) -- a claim that spent nothing reads no key here
)
SELECT 'claimed', p.n, i.event_id, i.key, i.seq, i.topic, i.type, i.source, i.content_type, i.headers::text, i.payload, i.created_at,
       'processing', i.attempts + 1, COALESCE(i.last_error, ''), i.next_attempt_at, i.received_at, COALESCE(i.finished_at, 'epoch')
  FROM p JOIN {schema}.inbox i ON i.group_name = $1 AND i.event_id = ANY ((SELECT array_agg(p.event_id) FROM p)::uuid[])
        AND i.ctid = p.tid AND i.event_id = p.event_id
 WHERE p.key NOT IN (SELECT l.key FROM lost l)
UNION ALL
SELECT 'dead', 0, x.event_id, x.key, x.seq, x.topic, x.type, x.source, x.content_type, x.headers::text, x.payload, x.created_at,
       x.state, x.attempts, COALESCE(x.last_error, ''), x.next_attempt_at, x.received_at, COALESCE(x.finished_at, 'epoch')
  FROM spent x
UNION ALL
SELECT 'idle', 0, '00000000-0000-0000-0000-000000000000'::uuid, k.key, 0, '', '', '', '', NULL, ''::bytea, now(),
       '', 0, '', now(), now(), 'epoch'
  FROM k WHERE k.key NOT IN (SELECT runs.key FROM runs) AND k.key NOT IN (SELECT x.key FROM spent x)
 ORDER BY 1, 2`

// sqlInboxRescueKeys locks up to $2 keys of group $1 due for a rescue (an
// expired claim, or suspect rows: see migration 011), oldest first, for
// the rest of a rescue's transaction.
const sqlInboxRescueKeys = `
SELECT key, claim_token IS NOT NULL, COALESCE(claim_from, 0), COALESCE(claim_through, 0), done_pos, suspect_through
  FROM {schema}.inbox_keys
 WHERE group_name = $1 AND rescue_at <= now() AND set_config('synchronous_commit', 'off', true) IS NOT NULL
 ORDER BY rescue_at LIMIT $2
   FOR UPDATE SKIP LOCKED`

// sqlInboxCharge counts an attempt for every unfinished row of key $2 that
// an expired claim covered (positions $3 to $4): its process crashed, or
// its handler outlived the claim, while it ran them. A rescue holds the
// key's row already, so it must not wait for an inbox row (the lock order
// is rows, then keys): a row locked by another transaction (a retraction,
// a late finish of the expired claim, both of which wait for the key) is
// left uncharged.
const sqlInboxCharge = `
UPDATE {schema}.inbox i SET attempts = attempts + 1
 WHERE i.event_id = ANY (ARRAY(
       SELECT l.event_id FROM {schema}.inbox l
        WHERE l.key = $2 AND l.group_name = $1 AND l.pos > $3 AND l.pos <= $4 AND l.state IN ('pending', 'failed')
        ORDER BY l.pos FOR UPDATE SKIP LOCKED)) AND i.group_name = $1 AND i.key = $2`

// sqlInboxHead reads key $2's first unfinished row above position $3.
const sqlInboxHead = `
SELECT i.pos, i.next_attempt_at <= now(), ` + inboxRowColumns + `
  FROM {schema}.inbox i CROSS JOIN (SELECT false AS claimed) cl
 WHERE i.key = $2 AND i.group_name = $1 AND i.pos > $3 AND ` + unfinishedAfter + `
 ORDER BY i.pos LIMIT 1`

// sqlInboxClaimOne claims key $2's row at position $3 alone, for a rescue.
const sqlInboxClaimOne = `
UPDATE {schema}.inbox_keys
   SET claim_token = $4::uuid, claim_dirty = false, claimed_by = $5, claim_from = $3 - 1, claim_through = $3, done_pos = $3 - 1,
       claim_expires_at = now() + $6 * interval '1 millisecond', rescue_at = now() + $6 * interval '1 millisecond',
       runnable_at = NULL, held_by = NULL, suspect_through = $7
 WHERE group_name = $1 AND key = $2`

// sqlInboxKill makes the row $2 DEAD: its attempts are spent. Like
// sqlInboxCharge, it does not wait for a row another transaction locked:
// it returns nothing then.
var sqlInboxKill = `
UPDATE {schema}.inbox i
   SET state = 'dead', finished_at = now(),
       last_error = $3 || COALESCE(' (last recorded error: ' || NULLIF(i.last_error, '') || ')', ''),
       attempt_log = ` + logAttempt("i.attempts", "'dead'", "$3") + `
 WHERE i.group_name = $1 AND i.event_id = $2 AND i.ctid = ANY (ARRAY(
       SELECT l.ctid FROM {schema}.inbox l WHERE l.group_name = $1 AND l.event_id = $2 FOR UPDATE SKIP LOCKED))
RETURNING i.state, i.attempts, COALESCE(i.last_error, ''), COALESCE(i.finished_at, 'epoch')`

// sqlInboxUnclaim ends key $2's claim (a rescue that claimed nothing) and
// records what the key's rows are suspect up to ($3: the rescue read the
// stored bound and the expired claim's, and lowers it below a row it made
// DEAD that ended them): the key is then recomputed (sqlInboxRefreshKeys).
const sqlInboxUnclaim = `
UPDATE {schema}.inbox_keys
   SET claim_token = NULL, claim_dirty = false, claimed_by = NULL, claim_from = NULL, claim_through = NULL, claim_expires_at = NULL,
       rescue_at = NULL, suspect_through = $3
 WHERE group_name = $1 AND key = $2`

// sqlInboxClaimHolders lists the workers holding unexpired claims of group
// $1 (a claim sets rescue_at to its expiry: inbox_keys_rescue_idx reads
// the group's claims only).
const sqlInboxClaimHolders = `
SELECT DISTINCT claimed_by FROM {schema}.inbox_keys
 WHERE group_name = $1 AND rescue_at > now() AND claim_token IS NOT NULL AND claim_expires_at > now() AND claimed_by IS NOT NULL`

// sqlInboxExpireClaims makes worker $2's unexpired claims of group $1
// expire now: due for a rescue, and fenced (every finish checks
// claim_expires_at). A key another transaction holds is skipped, not
// waited for (the caller tries again later): the keys are taken in key
// order, without waiting, so that this cannot deadlock with a finish.
const sqlInboxExpireClaims = `
UPDATE {schema}.inbox_keys k SET claim_expires_at = now(), rescue_at = now()
  FROM (SELECT key FROM {schema}.inbox_keys
         WHERE group_name = $1 AND rescue_at > now() AND claim_token IS NOT NULL AND claimed_by = $2 AND claim_expires_at > now()
         ORDER BY key FOR UPDATE SKIP LOCKED) x
 WHERE k.group_name = $1 AND k.key = x.key`

// sqlInboxRescueDue says whether a key of the group is due for a rescue.
const sqlInboxRescueDue = `
SELECT EXISTS (SELECT 1 FROM {schema}.inbox_keys WHERE group_name = $1 AND rescue_at <= now())`

// sqlInboxRetract marks a group's rows RETRACTED and returns, for each
// row found, its state before (PROCESSING inside a claim), its key and its
// position. Rows are locked first (as
// a finish does), keys only after, by the caller. A row inside a claim
// keeps the claim's attempt, which only a finish or a rescue would have
// stored: InboxRow.Attempts counts the row's claims.
var sqlInboxRetract = `
WITH old AS (
    SELECT event_id, state, key, pos FROM {schema}.inbox
     WHERE group_name = $1 AND event_id = ANY ($2::uuid[]) ORDER BY event_id FOR UPDATE
), o AS (
    SELECT i.*, cl.claimed FROM (SELECT old.*, $1::text AS group_name FROM old) i` + inboxClaimed + `
), up AS (
    UPDATE {schema}.inbox i
       SET state = 'retracted', finished_at = now(), attempts = i.attempts + o.claimed::int
      FROM o WHERE i.group_name = $1 AND i.event_id = o.event_id AND o.state <> 'retracted'
)
SELECT o.event_id::text, CASE WHEN o.claimed THEN 'processing' ELSE o.state END, o.key, o.pos FROM o`

// sqlInboxRetractClaims cuts the claims of keys $2 that cover a retracted
// row (at positions $3) short, to end just before the first such row: the
// worker running it finds its claim lost there, and its rows before stay
// its own (no other worker claims them while it may be running them). A
// claim with nothing left to run (every row of it finished or retracted)
// ends instead; one cut to nothing with rows after the cut (a batch may be
// running them) stays the worker's until it expires. It runs after the
// rows were retracted, in the same transaction; the caller then
// recomputes the keys (which marks the claims left: keyLowered).
const sqlInboxRetractClaims = `
UPDATE {schema}.inbox_keys k
   SET claim_through = CASE WHEN c.live THEN c.first - 1 END,
       claim_token = CASE WHEN c.live THEN k.claim_token END, claimed_by = CASE WHEN c.live THEN k.claimed_by END,
       claim_from = CASE WHEN c.live THEN k.claim_from END, claim_expires_at = CASE WHEN c.live THEN k.claim_expires_at END,
       rescue_at = CASE WHEN c.live THEN k.rescue_at END
  FROM (SELECT ck.key, min(r.pos) AS first, EXISTS (
               SELECT 1 FROM {schema}.inbox i
                WHERE i.key = ck.key AND i.group_name = $1 AND i.pos > min(ck.claim_from) AND i.pos <= min(ck.claim_through)
                  AND i.state IN ('pending', 'failed')) AS live
          FROM unnest($2::text[], $3::bigint[]) r(key, pos)
          JOIN {schema}.inbox_keys ck ON ck.group_name = $1 AND ck.key = r.key
         WHERE ck.claim_token IS NOT NULL AND r.pos > ck.claim_from AND r.pos <= ck.claim_through
         GROUP BY ck.key) c
 WHERE k.group_name = $1 AND k.key = c.key`
