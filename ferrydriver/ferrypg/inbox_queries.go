package ferrypg

import (
	"strconv"
	"strings"

	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

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
const sqlInboxInsert = `
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
), keys AS (
    INSERT INTO {schema}.inbox_keys AS k (group_name, key, runnable_at, tail_pos, done_pos)
    SELECT $1, key, now(), max(pos), min(pos) - 1 FROM ins GROUP BY key ORDER BY key
    ON CONFLICT (group_name, key) DO UPDATE
       SET tail_pos = greatest(k.tail_pos, excluded.tail_pos),
           done_pos = least(k.done_pos, excluded.done_pos),
           claim_dirty = k.claim_dirty OR (k.claim_token IS NOT NULL AND excluded.done_pos < k.claim_through),
           runnable_at = CASE WHEN k.runnable_at IS NULL AND k.held_by IS NULL AND k.claim_token IS NULL AND k.rescue_at IS NULL
                              THEN now() ELSE k.runnable_at END
    RETURNING 1
)
SELECT event_id FROM ins`

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
// Each row comes with what became of it: 'claimed' (ordered by key, then
// position), 'dead', or 'idle' (only the key is meaningful).
var sqlInboxClaim = `
WITH k AS (
    SELECT key, done_pos, runnable_at AS k_at FROM {schema}.inbox_keys
     WHERE group_name = $1 AND runnable_at <= now()
       AND set_config('synchronous_commit', 'off', true) IS NOT NULL
     ORDER BY runnable_at LIMIT $2
     FOR UPDATE SKIP LOCKED
), r AS MATERIALIZED (
    SELECT k.key, k.k_at, i.tid, i.event_id, i.pos, i.state, i.attempts, i.next_attempt_at,
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
      FROM (SELECT p.key, max(p.pos) AS through FROM p GROUP BY p.key) c
     WHERE ik.group_name = $1 AND ik.key = ANY ((SELECT array_agg(p.key) FROM p)::text[]) AND ik.key = c.key
), spent_keys AS (
    -- Hold: the dead row holds its key; Continue: the key moves past it.
    UPDATE {schema}.inbox_keys ik
       SET held_by = CASE WHEN ` + holdDead + ` THEN x.event_id END,
           done_pos = CASE WHEN ` + holdDead + ` THEN ik.done_pos ELSE x.pos END,
           runnable_at = CASE WHEN NOT ` + holdDead + ` AND ik.tail_pos > x.pos THEN now() END
      FROM spent x WHERE ik.group_name = $1 AND ik.key = ANY ((SELECT array_agg(x.key) FROM spent x)::text[]) AND ik.key = x.key
)
SELECT 'claimed', p.n, i.event_id, i.key, i.seq, i.topic, i.type, i.source, i.content_type, i.headers::text, i.payload, i.created_at,
       'processing', i.attempts + 1, COALESCE(i.last_error, ''), i.next_attempt_at, i.received_at, COALESCE(i.finished_at, 'epoch')
  FROM p JOIN {schema}.inbox i ON i.group_name = $1 AND i.event_id = ANY ((SELECT array_agg(p.event_id) FROM p)::uuid[])
        AND i.ctid = p.tid AND i.event_id = p.event_id
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

// sqlInboxFinishRows records the outcomes of claimed rows ($2..$7, one
// element per row) and moves their keys on (keeping their claims on what
// is left of them when $8, kx.keep: see finishKeeps); it returns the rows whose
// key's claim held (the others' claims were lost). A key's reported rows
// are taken in position order: those up to the first that did not finish
// (FAILED, given back, or DEAD under Hold), the "stop", are recorded; of
// those after it, only a counted failure is, as an attempt (its key goes
// on from the stop). A key's row is locked after the inbox rows and in key
// order (see the lock order above); it is then the latest version,
// whatever this statement's snapshot saw, so tail_pos says whether rows
// came for the key since it was claimed.
//
// A key whose claim holds (the token, unexpired) then moves: done_pos to
// the last row of the finished run (unless the key's queue changed under
// the claim: see keyLowered), and it is runnable
// again at once if rows are left (unreported rows of the claim, or rows
// after tail), at the stop's retry time, or never while a DEAD stop holds
// it. A key whose rows are suspect (an expired claim covered them) goes on
// through rescues instead.
//
// Every table is reached by its key columns from the rows given (a LATERAL
// with LIMIT, which the planner cannot turn into a join of its own
// choosing; = ANY): a generic plan made on an empty inbox cannot scan a
// group.
var sqlInboxFinishRows = `
WITH x AS MATERIALIZED (
    SELECT r.*, i.tid, i.key, i.pos,
           r.state = 'processed' OR (r.state = 'dead' AND NOT ` + holdDead + `) AS passes
      FROM unnest($2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::timestamptz[], $7::bool[])
           AS r(event_id, claim, state, err, retry_at, uncounted)
     CROSS JOIN LATERAL (
        SELECT i.ctid AS tid, i.key, i.pos FROM {schema}.inbox i WHERE i.event_id = r.event_id AND i.group_name = $1 LIMIT 1) i
), w AS MATERIALIZED (
    SELECT y.*, NOT y.run AND COALESCE(lag(y.run) OVER (PARTITION BY y.key ORDER BY y.pos), true) AS stop
      FROM (SELECT x.*, bool_and(x.passes) OVER (PARTITION BY x.key ORDER BY x.pos) AS run FROM x) y
), kx AS MATERIALIZED (
    SELECT w.key, min(w.claim::text)::uuid AS claim, count(DISTINCT w.claim) AS claims, min(w.pos) AS first, max(w.pos) AS reported,
           max(w.pos) FILTER (WHERE w.run) AS passed, $8::bool AS keep,
           min(w.state) FILTER (WHERE w.stop) AS st_state, min(w.retry_at) FILTER (WHERE w.stop) AS st_retry,
           min(w.event_id::text) FILTER (WHERE w.stop) AS st_id
      FROM w GROUP BY w.key
), upd AS (
    UPDATE {schema}.inbox i
       SET state = CASE WHEN w.run OR w.stop THEN w.state ELSE i.state END,
           attempts = CASE WHEN w.uncounted THEN i.attempts ELSE i.attempts + 1 END,
           last_error = CASE WHEN w.state = 'processed' THEN i.last_error ELSE w.err END,
           attempt_log = CASE WHEN NOT w.uncounted AND w.state IN ('failed', 'dead')
                              THEN ` + logAttempt("i.attempts + 1", "CASE WHEN w.run OR w.stop THEN w.state ELSE 'failed' END", "w.err") + `
                              ELSE i.attempt_log END,
           next_attempt_at = CASE WHEN w.run OR w.stop THEN COALESCE(w.retry_at, i.next_attempt_at) ELSE i.next_attempt_at END,
           finished_at = CASE WHEN NOT (w.run OR w.stop) THEN i.finished_at WHEN w.state IN ('processed', 'dead') THEN now() END
      FROM w
     WHERE i.group_name = $1 AND i.event_id = ANY ($2::uuid[]) AND i.ctid = w.tid AND i.event_id = w.event_id
       AND (w.run OR w.stop OR (NOT w.uncounted AND w.state IN ('failed', 'dead')))
    RETURNING 1
), locked AS MATERIALIZED (
    SELECT ik.key FROM {schema}.inbox_keys ik
     WHERE ik.group_name = $1 AND ik.key = ANY ((SELECT array_agg(kx.key) FROM kx)::text[]) AND (SELECT count(*) FROM upd) >= 0
     ORDER BY ik.key FOR UPDATE
), held AS (
    UPDATE {schema}.inbox_keys k
       SET claim_token = CASE WHEN ` + finishKeeps + ` THEN k.claim_token END, claim_dirty = false,
           claimed_by = CASE WHEN ` + finishKeeps + ` THEN k.claimed_by END,
           claim_from = CASE WHEN ` + finishKeeps + ` THEN kx.passed END,
           claim_through = CASE WHEN ` + finishKeeps + ` THEN k.claim_through END,
           claim_expires_at = CASE WHEN ` + finishKeeps + ` THEN k.claim_expires_at END,
           done_pos = ` + finishDone("COALESCE(kx.passed, k.claim_from)") + `,
           held_by = CASE WHEN NOT ` + keyLowered + ` AND kx.st_state = 'dead' THEN kx.st_id::uuid END,
           runnable_at = CASE WHEN ` + finishKeeps + ` THEN NULL
                              WHEN k.suspect_through <= ` + finishDone("COALESCE(kx.passed, k.claim_from)") + `
                              THEN ` + finishNext + ` END,
           rescue_at = CASE WHEN ` + finishKeeps + ` THEN k.rescue_at
                            WHEN k.suspect_through > ` + finishDone("COALESCE(kx.passed, k.claim_from)") + `
                            THEN ` + finishNext + ` END
      FROM kx
     WHERE k.group_name = $1 AND k.key = ANY ((SELECT array_agg(locked.key) FROM locked)::text[]) AND k.key = kx.key
       AND kx.claims = 1 AND k.claim_token = kx.claim AND k.claim_expires_at > clock_timestamp()
       AND kx.first > k.claim_from AND kx.reported <= k.claim_through
    RETURNING k.key
)
{tail}`

// The tails of the finish statements: one returns the rows whose key's
// claim held (the caller rolls back when some were lost); the other, for a
// finish sent with its transaction's COMMIT, raises when a claim was lost
// (inbox_claims_held, migration 011), which rolls that COMMIT back.
const (
	finishTail = `SELECT x.event_id FROM x WHERE x.key IN (SELECT held.key FROM held)`
	// Every reported row found, every key's claim held.
	finishRowsTailCommit = `SELECT {schema}.inbox_claims_held((SELECT count(*) FROM held),
    CASE WHEN (SELECT count(*) FROM x) < cardinality($2::uuid[]) THEN cardinality($2::uuid[]) + 1 ELSE (SELECT count(DISTINCT x.key) FROM x) END)`
	completeOneTailCommit = `SELECT {schema}.inbox_claims_held((SELECT count(*) FROM held), 1)`
)

// sqlInboxCompleteOne is sqlInboxFinishRows for one row that processed
// ($2, under the claim $3; $4: keep the claim on the rest of its run), the
// path of every event applied alone: two updates and no more, since the
// general statement's windows and sorts cost more to start than one row
// costs to finish. It returns the row if its key's claim held. The row's
// state is tested with NOT IN, which no partial index's predicate follows
// from: the only way to the row is its primary key, whatever the plan.
var sqlInboxCompleteOne = `
WITH x AS MATERIALIZED (
    UPDATE {schema}.inbox i SET state = 'processed', attempts = i.attempts + 1, finished_at = now()
     WHERE i.event_id = $2 AND i.group_name = $1 AND i.state NOT IN ('processed', 'dead', 'discarded', 'retracted')
    RETURNING i.event_id, i.key, i.pos
), kx AS (
    SELECT x.key, x.pos AS passed, x.pos AS reported, NULL::text AS st_state, NULL::timestamptz AS st_retry, NULL::text AS st_id,
           $4::bool AS keep FROM x
), held AS (
    UPDATE {schema}.inbox_keys k
       SET claim_token = CASE WHEN ` + finishKeeps + ` THEN k.claim_token END, claim_dirty = false,
           claimed_by = CASE WHEN ` + finishKeeps + ` THEN k.claimed_by END,
           claim_from = CASE WHEN ` + finishKeeps + ` THEN kx.passed END,
           claim_through = CASE WHEN ` + finishKeeps + ` THEN k.claim_through END,
           claim_expires_at = CASE WHEN ` + finishKeeps + ` THEN k.claim_expires_at END,
           done_pos = ` + finishDone("kx.passed") + `,
           held_by = NULL,
           runnable_at = CASE WHEN ` + finishKeeps + ` THEN NULL
                              WHEN k.suspect_through <= ` + finishDone("kx.passed") + `
                              THEN ` + finishNext + ` END,
           rescue_at = CASE WHEN ` + finishKeeps + ` THEN k.rescue_at
                            WHEN k.suspect_through > ` + finishDone("kx.passed") + `
                            THEN ` + finishNext + ` END
      FROM kx
     WHERE k.group_name = $1 AND k.key = kx.key AND k.claim_token = $3::uuid AND k.claim_expires_at > clock_timestamp()
       AND kx.passed > k.claim_from AND kx.passed <= k.claim_through
    RETURNING k.key
)
{tail}`

// sqlInboxCompleteRows is sqlInboxFinishRows for rows that all processed
// ($2), under one claim ($3; $4: keep it on what is left of the keys'
// runs): a batch that nothing failed in, the common case. With no row
// stopping a key, each key's run finished through its last row reported,
// and the windows and sorts that find where a run stopped are not needed.
var sqlInboxCompleteRows = `
WITH x AS MATERIALIZED (
    UPDATE {schema}.inbox i SET state = 'processed', attempts = i.attempts + 1, finished_at = now()
     WHERE i.event_id = ANY ($2::uuid[]) AND i.group_name = $1 AND i.state NOT IN ('processed', 'dead', 'discarded', 'retracted')
    RETURNING i.event_id, i.key, i.pos
), kx AS MATERIALIZED (
    SELECT x.key, min(x.pos) AS first, max(x.pos) AS passed, max(x.pos) AS reported,
           NULL::text AS st_state, NULL::timestamptz AS st_retry, NULL::text AS st_id, $4::bool AS keep
      FROM x GROUP BY x.key
), locked AS MATERIALIZED (
    SELECT ik.key FROM {schema}.inbox_keys ik
     WHERE ik.group_name = $1 AND ik.key = ANY ((SELECT array_agg(kx.key) FROM kx)::text[])
     ORDER BY ik.key FOR UPDATE
), held AS (
    UPDATE {schema}.inbox_keys k
       SET claim_token = CASE WHEN ` + finishKeeps + ` THEN k.claim_token END, claim_dirty = false,
           claimed_by = CASE WHEN ` + finishKeeps + ` THEN k.claimed_by END,
           claim_from = CASE WHEN ` + finishKeeps + ` THEN kx.passed END,
           claim_through = CASE WHEN ` + finishKeeps + ` THEN k.claim_through END,
           claim_expires_at = CASE WHEN ` + finishKeeps + ` THEN k.claim_expires_at END,
           done_pos = ` + finishDone("kx.passed") + `,
           held_by = NULL,
           runnable_at = CASE WHEN ` + finishKeeps + ` THEN NULL
                              WHEN k.suspect_through <= ` + finishDone("kx.passed") + `
                              THEN ` + finishNext + ` END,
           rescue_at = CASE WHEN ` + finishKeeps + ` THEN k.rescue_at
                            WHEN k.suspect_through > ` + finishDone("kx.passed") + `
                            THEN ` + finishNext + ` END
      FROM kx
     WHERE k.group_name = $1 AND k.key = ANY ((SELECT array_agg(locked.key) FROM locked)::text[]) AND k.key = kx.key
       AND k.claim_token = $3::uuid AND k.claim_expires_at > clock_timestamp()
       AND kx.first > k.claim_from AND kx.reported <= k.claim_through
    RETURNING k.key
)
{tail}`

// finishKeeps says whether a finish keeps its key's claim (kx.keep, the
// statement's parameter for the claim's rows left: a run of the key's events, each finished in a
// transaction of its own): every reported row finished and rows of the
// claim are left. The claim then starts after the rows finished; the
// worker running the run's later rows holds them still, and no other
// claims them meanwhile, even when the key's queue changed under the
// claim (keyLowered: done_pos stays where it was, below the claim's new
// start, and the run's last finish makes the key runnable from there).
const finishKeeps = `(kx.keep AND kx.st_state IS NULL AND kx.passed < k.claim_through)`

// keyLowered says whether key k's queue changed under its claim since the
// claim read it: a redrive or a delivery lowered done_pos below the claim's
// start, or (claim_dirty, migration 013) a row committed inside the
// claim's range, a redrive or discard there, or the group's dead policy
// changed. A finish then cannot tell what the claim saw from what it did
// not: it leaves done_pos where the claim began (finishDone), holds
// nothing (the next claim applies the policy in force) and makes the key
// runnable at once; the rows it finished are passed over by the next claim.
const keyLowered = `(k.done_pos < k.claim_from OR k.claim_dirty)`

// finishDone is where a finish moves key k's done_pos: past the rows that
// finished (passed), or, when the queue changed under the claim
// (keyLowered), no further than where the claim began.
func finishDone(passed string) string {
	return `CASE WHEN ` + keyLowered + ` THEN least(k.done_pos, k.claim_from) ELSE ` + passed + ` END`
}

// finishNext is when a key that a finish moved may run next (NULL: not
// until something changes it): at once when a redrive or a racing
// delivery lowered its done_pos since the claim, at the stopping row's
// retry time, never while its DEAD row holds it, at once when rows of the
// claim went unreported or rows came after it, never when it is idle.
const finishNext = `CASE
        WHEN ` + keyLowered + ` THEN now()
        WHEN kx.st_state = 'failed' THEN kx.st_retry
        WHEN kx.st_state = 'dead' THEN NULL
        WHEN kx.reported < k.claim_through THEN now()
        WHEN k.tail_pos > COALESCE(kx.passed, k.claim_from) THEN now()
        END`

// sqlInboxLostClaims names, of rows a finish reported under their claims
// ($2, $3), those whose key's claim does not hold (read after a finish
// sent with its COMMIT rolled back for a lost claim).
//
// Each row is reached by its primary key (a LIMIT 1 subquery that names
// no state, which no partial index serves) and its key by the key's: a
// plan made on an empty inbox cannot scan the group's unfinished rows.
const sqlInboxLostClaims = `
SELECT r.event_id FROM unnest($2::uuid[], $3::uuid[]) r(event_id, claim)
 WHERE NOT EXISTS (
       SELECT 1 FROM (SELECT i.key, i.pos, i.state FROM {schema}.inbox i WHERE i.event_id = r.event_id AND i.group_name = $1 LIMIT 1) i
         JOIN {schema}.inbox_keys k ON k.group_name = $1 AND k.key = i.key
        WHERE k.claim_token = r.claim AND k.claim_expires_at > clock_timestamp()
          AND i.pos > k.claim_from AND i.pos <= k.claim_through AND i.state IN ('pending', 'failed'))`

// sqlInboxNotify tells the callers awaiting events ($2) that they finished
// (in the states $3). It runs as its own statement after the rows changed
// (and their keys were locked), so under READ COMMITTED its snapshot sees
// every waiter registered before: a waiter registered later reads the row
// FOR SHARE, which waits for this commit. Under REPEATABLE READ or
// SERIALIZABLE (Config.InboxIsolation, or a caller's own transaction) the
// snapshot is the transaction's, which can predate a waiter that read the
// row before it changed: every finished event is notified then, waiters
// or not (what that costs: PostgreSQL orders the commits of transactions
// that notify).
const sqlInboxNotify = `
SELECT count(*) FROM (
    SELECT pg_notify($4, e.id::text || ':' || e.state)
      FROM unnest($2::uuid[], $3::text[]) e(id, state)
     WHERE current_setting('transaction_isolation') <> 'read committed'
        OR EXISTS (SELECT 1 FROM {schema}.settle_waiters w
                    WHERE w.group_name = $1 AND w.until > now() AND e.id = ANY (w.event_ids))) n`

// sqlInboxLockKeys locks the keys $2 of group $1, in key order.
const sqlInboxLockKeys = `
SELECT 1 FROM {schema}.inbox_keys WHERE group_name = $1 AND key = ANY ($2::text[]) ORDER BY key FOR UPDATE`

// sqlInboxRefreshKeys recomputes the keys $2 of group $1 from their
// queues, after a change that can move a key's head back or forth (a
// redrive, a discard, a retraction, a policy change, a claim that found a
// runnable key with nothing to run). It runs in a statement after
// sqlInboxLockKeys, so its snapshot sees every row committed before the
// locks were granted: all of each key's rows up to its tail_pos. The head
// is the key's first unfinished row from the start of its queue (the
// partial index holds unfinished rows only): one that a redrive made
// PENDING below done_pos is found. A claimed key keeps its claim, and only
// has done_pos lowered below such a row and the claim marked (claim_dirty:
// its finish then leaves done_pos no further than where the claim began
// and makes the key runnable, see keyLowered). Any other key: done_pos just below
// the head (the tail when none); held by a DEAD head under Hold; runnable
// when its head may run (through rescues while it is suspect); idle when
// it has no head.
var sqlInboxRefreshKeys = `
UPDATE {schema}.inbox_keys k
   SET done_pos = CASE WHEN k.claim_token IS NOT NULL THEN least(k.done_pos, h.pos - 1) ELSE COALESCE(h.pos - 1, k.tail_pos) END,
       claim_dirty = k.claim_token IS NOT NULL,
       held_by = CASE WHEN k.claim_token IS NOT NULL THEN k.held_by WHEN h.state = 'dead' THEN h.event_id END,
       runnable_at = CASE WHEN k.claim_token IS NOT NULL THEN k.runnable_at
                          WHEN h.pos IS NULL OR h.pos <= k.suspect_through THEN NULL ELSE ` + headNext + ` END,
       rescue_at = CASE WHEN k.claim_token IS NOT NULL THEN k.rescue_at
                        WHEN h.pos <= k.suspect_through THEN ` + headNext + ` END
  FROM unnest($2::text[]) kk(key)
  LEFT JOIN LATERAL (
    SELECT i.pos, i.event_id, i.state, i.next_attempt_at FROM {schema}.inbox i
     WHERE i.key = kk.key AND i.group_name = $1 AND ` + unfinishedAfter + `
     ORDER BY i.pos LIMIT 1) h ON true
 WHERE k.group_name = $1 AND k.key = kk.key`

// headNext is when a key whose head is h may run.
const headNext = `CASE h.state WHEN 'pending' THEN now() WHEN 'failed' THEN h.next_attempt_at END`

// logAttempt is row i's history (ferrydriver.Admin) with an entry
// for attempt n appended: the state it left the row in, its error; the
// oldest entry goes when the history is full.
func logAttempt(n, state, err string) string {
	return `(CASE WHEN jsonb_array_length(COALESCE(i.attempt_log, '[]')) >= ` + strconv.Itoa(driverkit.AttemptHistory) +
		` THEN i.attempt_log - 0 ELSE COALESCE(i.attempt_log, '[]') END) || jsonb_build_array(jsonb_build_object('n', ` + n +
		`, 'state', ` + state + `, 'error', left(` + err + `, ` + strconv.Itoa(driverkit.AttemptErrorChars) + `), 'at', now()))`
}

// sqlInboxAttempts reads the history of row $2 of group $1.
const sqlInboxAttempts = `SELECT i.attempt_log::text FROM {schema}.inbox i WHERE i.event_id = $2 AND i.group_name = $1 AND i.attempt_log IS NOT NULL`

// sqlInboxSetState moves DEAD rows to $3 (pending: redrive; discarded)
// and returns their keys; the caller recomputes the keys.
var sqlInboxSetState = `
UPDATE {schema}.inbox i
   SET state = $3,
       attempts = CASE WHEN $3 = 'pending' THEN 0 ELSE attempts END,
       attempt_log = CASE WHEN $3 = 'pending' THEN ` + logAttempt("i.attempts", "'pending'", "''") + ` ELSE attempt_log END,
       next_attempt_at = now(),
       finished_at = CASE WHEN $3 = 'discarded' THEN now() END -- a redriven row is unfinished again
 WHERE group_name = $1 AND event_id = ANY ($2::uuid[]) AND state = 'dead'
RETURNING key, event_id`

// sqlInboxSetPolicy stores a group's dead policy $2 and returns its sweep:
// whether one is pending, its generation and the last key it re-evaluated
// (NULL: none). A change (or a group's first policy) starts a new sweep
// from the first key; storing the same policy again leaves a pending sweep
// where it was, for the caller to finish.
const sqlInboxSetPolicy = `
INSERT INTO {schema}.inbox_groups AS g (group_name, hold_dead, sweeping, sweep_gen) VALUES ($1, $2, true, 1)
ON CONFLICT (group_name) DO UPDATE
   SET hold_dead   = excluded.hold_dead,
       sweeping    = g.sweeping OR g.hold_dead <> excluded.hold_dead,
       sweep_after = CASE WHEN g.hold_dead <> excluded.hold_dead THEN NULL ELSE g.sweep_after END,
       sweep_gen   = g.sweep_gen + CASE WHEN g.hold_dead <> excluded.hold_dead THEN 1 ELSE 0 END
RETURNING g.sweeping, g.sweep_gen, g.sweep_after`

// sqlInboxSweepFirst and sqlInboxSweepNext are a chunk of a policy sweep:
// the group $1's first $2 keys, or its first $2 keys after $3, in key
// order (a range of the primary key).
const (
	sqlInboxSweepFirst = `SELECT key FROM {schema}.inbox_keys WHERE group_name = $1 ORDER BY key LIMIT $2`
	sqlInboxSweepNext  = `SELECT key FROM {schema}.inbox_keys WHERE group_name = $1 AND key > $3 ORDER BY key LIMIT $2`
)

// sqlInboxSweepProgress records, in a chunk's transaction, that the sweep
// of generation $2 re-evaluated the keys up to $3 ($4: keys may remain),
// or finished (NOT $4). A sweep of an older generation records nothing;
// one behind a concurrent sweep of the same generation does not move the
// position back.
const sqlInboxSweepProgress = `
UPDATE {schema}.inbox_groups
   SET sweeping = $4, sweep_after = CASE WHEN $4 THEN $3 END
 WHERE group_name = $1 AND sweep_gen = $2 AND sweeping
   AND (NOT $4 OR sweep_after IS NULL OR sweep_after < $3)`

// sqlInboxGroups lists the groups whose policy is stored and those with
// keys in the inbox (a group whose consumer has not started yet, rows
// ingested by a source: listed with no stored policy, as holding). The
// keys' groups are found by a walk of inbox_keys' primary key that skips
// from one group to the next, O(groups) lookups, not O(keys).
const sqlInboxGroups = `
WITH RECURSIVE kg(group_name, n) AS (
    (SELECT group_name, 1 FROM {schema}.inbox_keys ORDER BY group_name LIMIT 1)
    UNION ALL
    SELECT (SELECT k.group_name FROM {schema}.inbox_keys k WHERE k.group_name > kg.group_name ORDER BY k.group_name LIMIT 1), kg.n + 1
      FROM kg WHERE kg.group_name IS NOT NULL AND kg.n < $1
)
SELECT n.group_name, COALESCE(p.hold_dead, true)
  FROM (SELECT group_name FROM kg WHERE group_name IS NOT NULL
        UNION SELECT group_name FROM {schema}.inbox_groups) n
  LEFT JOIN {schema}.inbox_groups p ON p.group_name = n.group_name
 ORDER BY n.group_name LIMIT $1`

// sqlInboxList lists a group's rows in the states $2, newest finished
// first. {stored} is the stored states those are (a PROCESSING row is
// stored PENDING or FAILED) as literals, which ListInbox writes from the
// known ones: with them, a plan made for any parameters can use the
// partial index of those states (inbox_dead_idx for DEAD, the console's
// list), where "state = ANY ($2)" alone read the whole group under a
// generic plan (TestConsolePagesAreFlat). A page after a cursor ($9..$11:
// finished rows only) is a range of that index too. {processing} adds the rows of
// the group's claims, found through its claimed keys (few, by nature),
// when PROCESSING is asked for.
const sqlInboxList = `
SELECT ` + inboxRowColumns + ` FROM (
    SELECT i.* FROM {schema}.inbox i
     WHERE i.group_name = $1 AND i.state IN ({stored})
       AND ($3 = '' OR i.key = $3) AND ($4 = '' OR i.type = $4)
       AND (cardinality($5::uuid[]) = 0 OR i.event_id = ANY ($5::uuid[]))
       AND ($6::timestamptz IS NULL OR i.finished_at >= $6) AND ($7::timestamptz IS NULL OR i.finished_at < $7)
       AND ($9::timestamptz IS NULL OR (i.finished_at <= $9 AND (i.finished_at, i.received_at, i.event_id) < ($9, $10, $11::uuid)))
    {processing}) i` + inboxClaimed + `
 WHERE {claimed}
 ORDER BY i.finished_at DESC NULLS FIRST, i.received_at DESC, i.event_id DESC LIMIT $8`

// inboxListClaimed is sqlInboxList's {claimed} when the states asked for
// include PENDING or FAILED, which a claimed row is stored as, and not
// PROCESSING, which it reads as: such a row is not listed. Otherwise every
// row found passes, and {claimed} is inboxListUnclaimed. A filter of the
// form "(CASE WHEN cl.claimed ...) = ANY ($2)" is estimated to keep a
// tiny fraction of the rows, so a page of a large inbox is costed as a walk
// of all of it, past jit_above_cost, and JIT compilation costs far more
// than the query (BenchmarkPagesAtScale; docs/benchmarks.md); the subplan
// also ran three times a row. inboxClaimed's subquery is kept
// whole (OFFSET 0): it runs once a row.
const (
	inboxListClaimed   = `NOT cl.claimed AND cardinality($2::text[]) > 0`
	inboxListUnclaimed = `cardinality($2::text[]) > 0`
)

// inboxListProcessing is sqlInboxList's {processing}: the rows inside the
// group's claims (claimed keys have rescue_at set: inbox_keys_rescue_idx).
const inboxListProcessing = `
    UNION
    SELECT i.* FROM {schema}.inbox_keys ck CROSS JOIN LATERAL (
        SELECT i.* FROM {schema}.inbox i
         WHERE i.key = ck.key AND i.group_name = $1 AND i.pos > ck.claim_from AND i.pos <= ck.claim_through
           AND i.state IN ('pending', 'failed')
           AND ($4 = '' OR i.type = $4) AND (cardinality($5::uuid[]) = 0 OR i.event_id = ANY ($5::uuid[]))
         ORDER BY i.pos) i
     WHERE ck.group_name = $1 AND ck.rescue_at IS NOT NULL AND ck.claim_token IS NOT NULL
       AND ($3 = '' OR ck.key = $3) AND $6::timestamptz IS NULL AND $7::timestamptz IS NULL`

const sqlInboxStates = `
SELECT ` + inboxRowColumns + ` FROM {schema}.inbox i` + inboxClaimed + `
 WHERE i.group_name = $1 AND i.event_id = ANY ($2::uuid[])`

// sqlInboxDeleteIdleKeys removes keys with nothing left to run or hold, a
// chunk at a time. Ingestion re-creates a key's row when it needs it; the
// row lock orders the two (an ingestion that inserted a row for the key
// either committed before this statement's snapshot, and the key is kept,
// or waits for the lock and then inserts the row afresh).
const sqlInboxDeleteIdleKeys = `
DELETE FROM {schema}.inbox_keys k
 WHERE k.group_name = $1 AND (k.group_name, k.key) IN (
       SELECT group_name, key FROM {schema}.inbox_keys
        WHERE group_name = $1 AND runnable_at IS NULL AND held_by IS NULL AND claim_token IS NULL AND rescue_at IS NULL
        LIMIT $2 FOR UPDATE SKIP LOCKED)
   AND NOT EXISTS (SELECT 1 FROM {schema}.inbox i
                    WHERE i.key = k.key AND i.group_name = k.group_name
                      AND i.state IN ('pending', 'processing', 'failed', 'dead'))`

// sqlInboxCounts counts a group's PENDING, PROCESSING, FAILED and DEAD
// rows, each up to $2, through inbox_state_pages_idx (migration 016): O($2)
// whatever the backlog. The states are literals so that the partial index
// applies, and each count reads in the index's order: a sequential scan
// with a LIMIT looked as cheap to the planner, whatever the table held
// before the rows it counts (1,936 buffers for a count of 100 PENDING rows
// behind 100,000 DEAD ones, TestConsolePagesAreFlat, now and then). Rows
// inside claims (found through the claimed keys) count as PROCESSING, not
// as what they are stored as.
var sqlInboxCounts = `
WITH claimed AS MATERIALIZED (
    SELECT i.state FROM {schema}.inbox_keys ck CROSS JOIN LATERAL (
        SELECT i.state FROM {schema}.inbox i
         WHERE i.key = ck.key AND i.group_name = $1 AND i.pos > ck.claim_from AND i.pos <= ck.claim_through
           AND i.state IN ('pending', 'failed')) i
     WHERE ck.group_name = $1 AND ck.rescue_at IS NOT NULL AND ck.claim_token IS NOT NULL
     LIMIT $2
)
SELECT ` + strings.Join(func() []string {
	var q []string
	for _, st := range []string{"pending", "processing", "failed", "dead"} {
		stored := `(SELECT count(*) FROM (SELECT 1 FROM {schema}.inbox WHERE group_name = $1 AND state = '` + st + `'
                                 ORDER BY finished_at, received_at, event_id LIMIT $2) c)`
		switch st {
		case "processing":
			stored = `(SELECT count(*) FROM claimed)`
		case "pending", "failed":
			// At the cap it stays the cap: the count is "at least".
			stored = `(SELECT CASE WHEN n >= $2 THEN n ELSE greatest(n - (SELECT count(*) FROM claimed WHERE state = '` + st + `'), 0) END FROM ` + stored + ` n(n))`
		}
		q = append(q, stored)
	}
	return q
}(), ", ")

const sqlInboxDeleteProcessed = `
DELETE FROM {schema}.inbox WHERE group_name = $1 AND event_id IN (
    SELECT event_id FROM {schema}.inbox
     WHERE group_name = $1 AND state = 'processed' AND finished_at < now() - $2 * interval '1 millisecond'
     ORDER BY finished_at LIMIT $3)`

const sqlWaiterAdd = `
INSERT INTO {schema}.settle_waiters (id, group_name, event_ids, until)
SELECT $1, $2, $3::uuid[], $4 WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL`

const sqlWaiterRemove = `DELETE FROM {schema}.settle_waiters WHERE id = $1 OR until < now() - interval '1 minute'`

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
