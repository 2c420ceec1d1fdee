package ferrypg

import "strings"

// SQL of the inbox's operator side: attempt history, redrives and
// discards, the dead policy and its sweep, listing, counting, retention
// and settlement waiters (see inbox_queries.go for the claim model).

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
