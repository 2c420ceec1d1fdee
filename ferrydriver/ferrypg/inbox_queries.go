package ferrypg

import "strings"

// SQL of the consumer inbox (migration 002). {schema} is replaced by the
// quoted schema name.

// sqlInboxInsert records events once per (group, event ID) and makes the
// keys that had nothing to do runnable. Inserting first and locking the
// key rows second (in key order) cannot deadlock with completion, which
// updates the completed row and then locks its key. It updates the row of
// every key it inserted for, even one that stays as it was: a completion
// running under REPEATABLE READ or SERIALIZABLE (a database default, or
// Config.InboxIsolation) whose snapshot misses the new row then fails to
// lock the key with a serialization failure, and runs again, instead of
// marking the key idle with a row left in it.
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
    RETURNING event_id, key
), keys AS (
    INSERT INTO {schema}.inbox_keys AS k (group_name, key, runnable_at)
    SELECT DISTINCT $1, key, now() FROM ins ORDER BY 2
    ON CONFLICT (group_name, key) DO UPDATE
       SET runnable_at = CASE WHEN k.runnable_at IS NULL AND k.held_by IS NULL THEN now() ELSE k.runnable_at END
    RETURNING 1
)
SELECT event_id FROM ins`

// The claim statements. A head is a key's oldest unfinished row (a DEAD
// row counts when the group holds keys behind dead rows). Its commit is
// asynchronous: a claim lost in a database crash only means the row runs
// again, which the inbox absorbs. Each row claimed gets the token $5; a
// head that already had $6 attempts ($6 > 0) goes DEAD with the reason $7
// instead, and its key follows the group's stored policy ({hold}).
//
// sqlInboxClaim claims the heads of up to $2 runnable keys that are
// PENDING, or FAILED and due. sqlInboxRescue claims up to $2 heads that
// are PROCESSING with an expired claim (their worker died, or outlived the
// claim): the consumer runs those one at a time, alone, so that one which
// crashes its process takes no other event's attempt with it.

// claimHeads selects, for the locked keys k, the heads that may run now
// ({runnable} on h), unless another row of the key runs (a redriven older
// row under Continue).
const claimHeads = `
head AS MATERIALIZED (
    SELECT h.event_id, h.tid, k.group_name FROM k CROSS JOIN LATERAL (
        SELECT ctid AS tid, event_id, state, next_attempt_at, claim_expires_at FROM {schema}.inbox i
         WHERE i.group_name = k.group_name AND i.key = k.key
           AND i.state IN ('pending', 'processing', 'failed', 'dead') AND (i.state <> 'dead' OR {hold})
         ORDER BY pos LIMIT 1) h
     WHERE {runnable}
       AND NOT EXISTS (SELECT 1 FROM {schema}.inbox p
                        WHERE p.key = k.key AND p.group_name = k.group_name AND p.state = 'processing'
                          AND p.claim_expires_at > now() AND p.event_id <> h.event_id)
), exhausted AS (
    UPDATE {schema}.inbox i
       SET state = 'dead', claimed_by = NULL, claim_expires_at = NULL, claim_token = NULL, finished_at = now(),
           last_error = $7 || COALESCE(' (last recorded error: ' || NULLIF(i.last_error, '') || ')', '')
      FROM head WHERE i.ctid = head.tid AND i.event_id = head.event_id AND i.group_name = head.group_name
       AND $6 > 0 AND i.attempts >= $6 AND {runnable_i}
    RETURNING i.*
), claimed AS (
    -- The row is re-checked: it may have changed since the snapshot. It is
    -- found by its tuple id (a join on the primary key let the planner
    -- scan the group's unfinished rows instead when its statistics were
    -- stale); a row updated meanwhile has a new one, fails the recheck and
    -- is left for the next claim.
    UPDATE {schema}.inbox i
       SET state = 'processing', attempts = attempts + 1, claimed_by = $3, claim_token = $5::uuid,
           claim_expires_at = now() + $4 * interval '1 millisecond'
      FROM head WHERE i.ctid = head.tid AND i.event_id = head.event_id AND i.group_name = head.group_name
       AND NOT ($6 > 0 AND i.attempts >= $6) AND {runnable_i}
    RETURNING i.*
), keys AS (
    UPDATE {schema}.inbox_keys ik SET runnable_at = c.claim_expires_at
      FROM claimed c WHERE ik.group_name = c.group_name AND ik.key = c.key
), dead_keys AS (
    -- Hold: the dead head holds its key; Continue: the next row may run.
    UPDATE {schema}.inbox_keys ik
       SET runnable_at = CASE WHEN {hold} THEN NULL ELSE now() END,
           held_by = CASE WHEN {hold} THEN x.event_id END
      FROM exhausted x WHERE ik.group_name = x.group_name AND ik.key = x.key
)`

const claimResult = `
SELECT ` + inboxRowColumns + ` FROM (SELECT * FROM claimed UNION ALL SELECT * FROM exhausted) r ORDER BY pos`

func claimCondition(prefix string, rescue bool) string {
	if rescue {
		return "(" + prefix + ".state = 'processing' AND " + prefix + ".claim_expires_at <= now())"
	}
	return "(" + prefix + ".state = 'pending' OR (" + prefix + ".state = 'failed' AND " + prefix + ".next_attempt_at <= now()))"
}

func claimHeadsFor(rescue bool) string {
	return strings.NewReplacer("{runnable}", claimCondition("h", rescue), "{runnable_i}", claimCondition("i", rescue),
		"{hold}", holdDead).Replace(claimHeads)
}

// holdDead is the dead policy stored for the group $1 (SetInboxPolicy), the
// only one: true (Hold) when none is. It is evaluated once per statement.
const holdDead = `COALESCE((SELECT hold_dead FROM {schema}.inbox_groups WHERE group_name = $1), true)`

var sqlInboxClaim = `
WITH k AS (
    SELECT group_name, key FROM {schema}.inbox_keys
     WHERE group_name = $1 AND runnable_at <= now()
       AND set_config('synchronous_commit', 'off', true) IS NOT NULL
     ORDER BY runnable_at LIMIT $2
     FOR UPDATE SKIP LOCKED
), ` + claimHeadsFor(false) + `, idle AS (
    -- Keys that were due but had nothing to claim (a rescue among them)
    -- go to the back for a second, so that they cannot crowd out the others.
    UPDATE {schema}.inbox_keys ik SET runnable_at = now() + interval '1 second'
      FROM k WHERE ik.group_name = k.group_name AND ik.key = k.key
       AND k.key NOT IN (SELECT key FROM claimed) AND k.key NOT IN (SELECT key FROM exhausted)
)` + claimResult

var sqlInboxRescue = `
WITH expired AS (
    SELECT key FROM {schema}.inbox
     WHERE group_name = $1 AND state = 'processing' AND claim_expires_at <= now()
       AND set_config('synchronous_commit', 'off', true) IS NOT NULL
     ORDER BY claim_expires_at LIMIT $2
), k AS (
    SELECT ik.group_name, ik.key FROM {schema}.inbox_keys ik
     WHERE ik.group_name = $1 AND ik.key IN (SELECT key FROM expired)
     FOR UPDATE SKIP LOCKED
), ` + claimHeadsFor(true) + claimResult

// sqlInboxRescueDue says whether a claim of the group has expired.
const sqlInboxRescueDue = `
SELECT EXISTS (SELECT 1 FROM {schema}.inbox WHERE group_name = $1 AND state = 'processing' AND claim_expires_at <= now())`

// sqlInboxFinish ends a claimed attempt: PROCESSED, FAILED or DEAD ($7:
// the attempt is taken back, its handler never ran). It matches nothing
// unless $3 is the row's current, unexpired claim. It also locks the
// row's key (as sqlInboxLockKey does), so that the refresh that follows,
// in a statement of its own, sees every row committed before the lock was
// granted.
const sqlInboxFinish = `
WITH upd AS (
    UPDATE {schema}.inbox
       SET state = $4, claimed_by = NULL, claim_expires_at = NULL, claim_token = NULL,
           attempts = CASE WHEN $7 THEN greatest(attempts - 1, 0) ELSE attempts END,
           last_error = CASE WHEN $4 = 'processed' THEN last_error ELSE $5 END,
           next_attempt_at = COALESCE($6::timestamptz, next_attempt_at),
           finished_at = CASE WHEN $4 IN ('processed', 'dead') THEN now() END
     WHERE group_name = $1 AND event_id = $2 AND claim_token = $3::uuid AND state = 'processing'
       AND claim_expires_at > clock_timestamp()
    RETURNING key
), locked AS (
    SELECT 1 FROM {schema}.inbox_keys WHERE group_name = $1 AND key = (SELECT key FROM upd) FOR UPDATE
)
SELECT key FROM upd WHERE (SELECT count(*) FROM locked) >= 0`

// sqlInboxNotify tells the callers awaiting events that they finished. It
// runs as its own statement after the row changed (and its key was
// locked), so its snapshot sees every waiter registered before: a waiter
// registered later reads the row FOR SHARE, which waits for this commit.
const sqlInboxNotify = `
SELECT count(*) FROM (
    SELECT pg_notify($4, e.id::text || ':' || $3)
      FROM unnest($2::uuid[]) e(id)
      JOIN {schema}.settle_waiters w ON w.group_name = $1 AND w.until > now() AND e.id = ANY (w.event_ids)) n`

// sqlInboxSetState moves DEAD rows to $3 (pending: redrive; discarded)
// and returns their keys; finishing rows notify waiters as above.
const sqlInboxSetState = `
UPDATE {schema}.inbox
   SET state = $3,
       attempts = CASE WHEN $3 = 'pending' THEN 0 ELSE attempts END,
       next_attempt_at = now(),
       finished_at = CASE WHEN $3 = 'discarded' THEN now() ELSE finished_at END
 WHERE group_name = $1 AND event_id = ANY ($2::uuid[]) AND state = 'dead'
RETURNING key, event_id`

// sqlInboxSetPolicy stores a group's dead policy and says whether it changed.
const sqlInboxSetPolicy = `
WITH old AS (SELECT hold_dead FROM {schema}.inbox_groups WHERE group_name = $1),
up AS (
    INSERT INTO {schema}.inbox_groups (group_name, hold_dead) VALUES ($1, $2)
    ON CONFLICT (group_name) DO UPDATE SET hold_dead = excluded.hold_dead
)
SELECT COALESCE((SELECT hold_dead FROM old) IS DISTINCT FROM $2, true)`

const sqlInboxGroups = `SELECT group_name FROM {schema}.inbox_groups ORDER BY group_name LIMIT $1`

const sqlInboxGroupKeys = `SELECT key FROM {schema}.inbox_keys WHERE group_name = $1 ORDER BY key`

const inboxRowColumns = `event_id, key, seq, topic, type, source, content_type, headers::text, payload, created_at,
       state, attempts, COALESCE(last_error, ''), next_attempt_at, received_at, COALESCE(finished_at, 'epoch')`

// sqlInboxList lists a group's rows in the states $2, newest finished
// first. {states} is the same states as literals (ListInbox writes them
// from the known ones): with them, a plan made for any parameters can
// use the partial index of those states (inbox_dead_idx for DEAD, the
// console's list), where "state = ANY ($2)" alone read the whole group
// under a generic plan (TestConsolePagesAreFlat).
const sqlInboxList = `
SELECT ` + inboxRowColumns + ` FROM {schema}.inbox
 WHERE group_name = $1 AND state = ANY ($2::text[]) AND state IN ({states})
   AND ($3 = '' OR key = $3) AND ($4 = '' OR type = $4)
   AND (cardinality($5::uuid[]) = 0 OR event_id = ANY ($5::uuid[]))
   AND ($6::timestamptz IS NULL OR finished_at >= $6) AND ($7::timestamptz IS NULL OR finished_at < $7)
 ORDER BY finished_at DESC NULLS FIRST, received_at DESC LIMIT $8`

const sqlInboxStates = `
SELECT ` + inboxRowColumns + ` FROM {schema}.inbox
 WHERE group_name = $1 AND event_id = ANY ($2::uuid[])`

// sqlInboxDeleteIdleKeys removes keys with nothing left to run or hold, a
// chunk at a time. Ingestion re-creates a key's row when it needs it; the
// row lock orders the two (an ingestion that inserted a row for the key
// either committed before this statement's snapshot, and the key is kept,
// or waits for the lock and then inserts the row afresh).
const sqlInboxDeleteIdleKeys = `
DELETE FROM {schema}.inbox_keys k
 WHERE k.group_name = $1 AND (k.group_name, k.key) IN (
       SELECT group_name, key FROM {schema}.inbox_keys
        WHERE group_name = $1 AND runnable_at IS NULL AND held_by IS NULL
        LIMIT $2 FOR UPDATE SKIP LOCKED)
   AND NOT EXISTS (SELECT 1 FROM {schema}.inbox i
                    WHERE i.key = k.key AND i.group_name = k.group_name
                      AND i.state IN ('pending', 'processing', 'failed', 'dead'))`

// sqlInboxCounts counts a group's PENDING, PROCESSING, FAILED and DEAD
// rows, each up to $2, through inbox_states_idx (migration 007): O($2)
// whatever the backlog. The states are literals so that the partial index
// applies.
var sqlInboxCounts = "SELECT " + strings.Join(func() []string {
	var q []string
	for _, st := range []string{"pending", "processing", "failed", "dead"} {
		q = append(q, `(SELECT count(*) FROM (SELECT 1 FROM {schema}.inbox WHERE group_name = $1 AND state = '`+st+`' LIMIT $2) c)`)
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

const sqlInboxLockKey = `
SELECT 1 FROM {schema}.inbox_keys WHERE group_name = $1 AND key = $2 FOR UPDATE`

// keyHeadSet sets a key's runnable_at and held_by from its head h (the
// columns of the inbox row) and until, the latest claim of another of its
// rows still running (NULL: none).
func keyHeadSet(h, until string) string {
	return strings.NewReplacer("{h}", h, "{until}", until).Replace(`
    runnable_at = CASE
        WHEN {until} IS NOT NULL THEN {until} -- a row of the key is running
        WHEN {h}.state = 'pending' THEN now()
        WHEN {h}.state = 'failed' THEN {h}.next_attempt_at
        WHEN {h}.state = 'processing' THEN {h}.claim_expires_at
        ELSE NULL END,
    held_by = CASE WHEN {h}.state = 'dead' THEN {h}.event_id END`)
}

// sqlInboxRefreshKey recomputes when a key's head may run, after its head
// changed. It runs in a statement after sqlInboxLockKey, so its snapshot
// sees every row committed before the lock was granted. Under the group's
// stored policy, a DEAD head holds its key.
var sqlInboxRefreshKey = refreshKey("$2")

// refreshKey is sqlInboxRefreshKey for the key of group $1 that the
// expression key names.
func refreshKey(key string) string {
	return strings.ReplaceAll(`
UPDATE {schema}.inbox_keys k SET `+keyHeadSet("h", "busy.until")+`
  FROM (SELECT NULL) dummy
  LEFT JOIN LATERAL (
    SELECT event_id, state, next_attempt_at, claim_expires_at FROM {schema}.inbox i
     WHERE i.group_name = $1 AND i.key = {key}
       AND i.state IN ('pending', 'processing', 'failed', 'dead') AND (i.state <> 'dead' OR `+holdDead+`)
     ORDER BY pos LIMIT 1) h ON true
  LEFT JOIN LATERAL (
    SELECT max(claim_expires_at) AS until FROM {schema}.inbox p
     WHERE p.key = {key} AND p.group_name = $1 AND p.state = 'processing' AND p.claim_expires_at > now()) busy ON true
 WHERE k.group_name = $1 AND k.key = {key}`, "{key}", key)
}

// sqlInboxRefreshKeyNotify is sqlInboxRefreshKey for the key of the row
// $2 that just finished (in state $3), which also tells the callers
// awaiting it (as sqlInboxNotify does, on channel $4) when $3 is a final
// state. It runs after the statement that changed the row and locked the
// key, in the same round trip (a pipeline), so it finds the key by the
// row.
var sqlInboxRefreshKeyNotify = refreshKey(`(SELECT key FROM {schema}.inbox WHERE group_name = $1 AND event_id = $2::uuid)`) + `
RETURNING (SELECT count(*) FROM (
    SELECT pg_notify($4, $2::text || ':' || $3)
      FROM {schema}.settle_waiters w
     WHERE $3 IN ('processed', 'dead') AND w.group_name = $1 AND w.until > now() AND $2::uuid = ANY (w.event_ids)) n)`

// sqlInboxRetract marks a group's rows RETRACTED and returns, for each
// row found, its state before and its key. Rows are locked first (as
// completion does), keys only after, by the caller.
const sqlInboxRetract = `
WITH old AS (
    SELECT event_id, state, key FROM {schema}.inbox
     WHERE group_name = $1 AND event_id = ANY ($2::uuid[]) ORDER BY event_id FOR UPDATE
), up AS (
    UPDATE {schema}.inbox i
       SET state = 'retracted', claimed_by = NULL, claim_expires_at = NULL, finished_at = now()
      FROM old WHERE i.group_name = $1 AND i.event_id = old.event_id AND old.state <> 'retracted'
)
SELECT event_id::text, state, key FROM old`
