package ferrypg

import (
	"strconv"

	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// SQL of the inbox's finishes: recording outcomes, moving a key past
// the rows that finished, and giving the rest of a claim back (see
// inbox_queries.go for the claim model and the lock order).

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
), locked AS MATERIALIZED (` + lockKeys("(SELECT count(*) FROM upd) >= 0") + `
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
     WHERE k.group_name = $1 AND k.key = kx.key
       AND k.key >= (SELECT min(locked.key) FROM locked) AND k.key <= (SELECT max(locked.key) FROM locked)
       AND kx.claims = 1 AND k.claim_token = kx.claim AND k.claim_expires_at > clock_timestamp()
       AND kx.first > k.claim_from AND kx.reported <= k.claim_through
    RETURNING k.key
)
{tail}`

// The finishes' key updates (held) join kx's keys to the group's, within
// the range of the keys locked: reading that range makes the update wait
// for the locks, and bounds the scan that a plan made while the statistics
// said the group was small does for the join instead of probing each key
// (a finish of one key's rows, the common case, reads that key's row only).
// A key of kx in the range with no row locked has no row to update.
// (Reaching each key's row by its ctid instead was tried: an update
// through a ctid does not follow the row to a version committed after the
// statement's snapshot, PostgreSQL rechecking a TID scan's match against
// the newer version's own ctid, so a finish that had waited for a
// delivery of its key lost its claim:
// TestInboxFinishThatWaitedForADeliveryOfItsKeyHolds.)
//
// lockKeys locks the rows of kx's keys in key order (the lock order: OFFSET
// 0 keeps the sorted keys a subquery of their own, whose order the locking
// loop follows), once after holds (an expression that makes the locks wait
// for what must come first). Each key's row is looked up alone (a LATERAL
// with LIMIT): a plan made while the statistics said the group was small
// cannot scan the group's keys instead, as = ANY let it (a filter over
// every key of the group: thousands of buffers at 30,000 keys).
func lockKeys(after string) string {
	return `
    SELECT l.key FROM (SELECT kx.key FROM kx WHERE ` + after + ` ORDER BY kx.key OFFSET 0) o
     CROSS JOIN LATERAL (
        SELECT ik.key FROM {schema}.inbox_keys ik WHERE ik.group_name = $1 AND ik.key = o.key LIMIT 1 FOR UPDATE) l`
}

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
// from: the only way to the row is its primary key, whatever the plan; the
// key's row is reached by its primary key too (x holds one row: its key is
// a value, not a join that a plan made on a small group could turn into a
// scan of the group's keys).
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
     WHERE k.group_name = $1 AND k.key = (SELECT x.key FROM x) AND k.key = kx.key AND k.claim_token = $3::uuid AND k.claim_expires_at > clock_timestamp()
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
), locked AS MATERIALIZED (` + lockKeys("true") + `
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
     WHERE k.group_name = $1 AND k.key = kx.key
       AND k.key >= (SELECT min(locked.key) FROM locked) AND k.key <= (SELECT max(locked.key) FROM locked)
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
// it has no head. The keys' rows are looked for between the least and the
// greatest of $2 (see held): a plan made on a group the statistics thought
// small scans that range of the group's keys, not all of them.
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
 WHERE k.group_name = $1 AND k.key = kk.key
   AND k.key >= (SELECT min(r.key) FROM unnest($2::text[]) r(key)) AND k.key <= (SELECT max(r.key) FROM unnest($2::text[]) r(key))`

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
