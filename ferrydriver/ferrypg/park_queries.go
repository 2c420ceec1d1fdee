package ferrypg

// SQL of the parked keys (migration 006, 018): a relay's stuck keys and
// the dead letters redriven to their feeds. {schema} is replaced by the
// quoted schema name.

// sqlParkEvents appends events to their keys' queues, in the caller's order.
const sqlParkEvents = `
WITH lease AS (` + sqlLeaseShare + `
), ins AS (
    INSERT INTO {schema}.parked (feed, key, event_id, topic, seq, type, source,
                                 content_type, headers, payload, created_at, reason)
    SELECT $1, t.key, t.event_id, t.topic, t.seq, t.type, t.source, t.content_type,
           NULLIF(t.headers, '')::jsonb, t.payload, t.created_at, $14
      FROM unnest($4::uuid[], $5::text[], $6::text[], $7::bigint[], $8::text[],
                  $9::text[], $10::text[], $11::text[], $12::bytea[], $13::timestamptz[])
           WITH ORDINALITY AS t(event_id, topic, key, seq, type, source, content_type, headers, payload, created_at, ord)
     WHERE EXISTS (SELECT 1 FROM lease)
     ORDER BY t.ord
    ON CONFLICT (feed, event_id) DO NOTHING
)
SELECT count(*) FROM lease`

const parkedColumns = `p.event_id, p.topic, p.key, p.seq, p.type, p.source, p.content_type, p.headers::text, p.payload, p.created_at, p.parked_at, p.held, p.reason, p.redriven, p.attempts, COALESCE(p.first_failure, 'epoch')`

// sqlParkedHeadsOf reads the head of each key named: one primary-key probe
// per key, whatever the length of its queue.
//
//	Nested Loop -> Function Scan on unnest k
//	            -> Limit -> Index Scan using parked_pkey on parked p
//	                          Index Cond: ((feed = $1) AND (key = k.key))
const sqlParkedHeadsOf = `
SELECT ` + parkedColumns + `, 0::bigint
  FROM unnest($2::text[]) AS k(key)
 CROSS JOIN LATERAL (
       SELECT * FROM {schema}.parked p
        WHERE p.feed = $1 AND p.key = k.key
        ORDER BY p.id LIMIT 1) p`

// sqlParkedHeads lists every parked key's head with its queue length; it
// reads every parked row of the feed (leadership start, ferry status).
const sqlParkedHeads = `
SELECT ` + parkedColumns + `, p.queued FROM (
    SELECT DISTINCT ON (key) *, count(*) OVER (PARTITION BY key) AS queued
      FROM {schema}.parked WHERE feed = $1
     ORDER BY key, id) p
 ORDER BY p.parked_at, p.key
 LIMIT $2`

// sqlParkedRedriven reads the head of each key (at most $2) with a
// redriven event in its queue: the keys from parked_redriven_idx
// (migration 017), which holds the redriven events waiting only, then a
// primary-key probe per key.
const sqlParkedRedriven = `
SELECT ` + parkedColumns + `, 0::bigint
  FROM (SELECT DISTINCT key FROM {schema}.parked WHERE feed = $1 AND redriven LIMIT $2) k
 CROSS JOIN LATERAL (
       SELECT * FROM {schema}.parked p
        WHERE p.feed = $1 AND p.key = k.key
        ORDER BY p.id LIMIT 1) p`

// sqlRedriveToParked appends the dead letters named ($1 feeds, $2 event
// IDs, in that order) to their keys' queues in their feeds, marked
// redriven: what RedriveDeadLetters does, in its transaction.
const sqlRedriveToParked = `
INSERT INTO {schema}.parked (feed, key, event_id, topic, seq, type, source,
                             content_type, headers, payload, created_at, reason, redriven)
SELECT d.feed, d.key, d.event_id, d.topic, d.seq, d.type, d.source, d.content_type, d.headers, d.payload, d.created_at,
       'redriven by an operator after: ' || d.reason, true
  FROM unnest($1::text[], $2::uuid[]) WITH ORDINALITY AS s(feed, event_id, ord)
  JOIN {schema}.dead_letters d ON d.feed = s.feed AND d.event_id = s.event_id
 ORDER BY s.ord
ON CONFLICT (feed, event_id) DO NOTHING`

// sqlUnparkEvent removes a key's head, storing it as a dead letter when
// $6 (the reason) is not NULL.
const sqlUnparkEvent = `
WITH lease AS (` + sqlLeaseShare + `
), del AS (
    DELETE FROM {schema}.parked
     WHERE feed = $1 AND event_id = $5 AND key = $4 AND EXISTS (SELECT 1 FROM lease)
    RETURNING *
), dl AS (
    INSERT INTO {schema}.dead_letters (feed, event_id, topic, key, seq, type, source,
                                       content_type, headers, payload, created_at, reason)
    SELECT feed, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at, $6
      FROM del WHERE $6::text IS NOT NULL
    ON CONFLICT (feed, event_id) DO NOTHING
)
SELECT count(*) FROM lease`

const sqlHoldParked = `
WITH lease AS (` + sqlLeaseShare + `
), up AS (
    UPDATE {schema}.parked SET held = true, reason = $6
     WHERE feed = $1 AND event_id = $5 AND key = $4 AND EXISTS (SELECT 1 FROM lease)
)
SELECT count(*) FROM lease`

// sqlSetParkedAttempts records the failed attempts ($6) of a key's head
// and the time of the first ($7), fenced.
const sqlSetParkedAttempts = `
WITH lease AS (` + sqlLeaseShare + `
), up AS (
    UPDATE {schema}.parked SET attempts = $6, first_failure = $7
     WHERE feed = $1 AND event_id = $5 AND key = $4 AND EXISTS (SELECT 1 FROM lease)
)
SELECT count(*) FROM lease`

// sqlReleaseParked lets the relay retry a key's head ($3 false) or moves
// the head to the dead letters ($3 true). It returns one row if the key
// has a parked event.
const sqlReleaseParked = `
WITH h AS (
    SELECT feed, key, id FROM {schema}.parked
     WHERE feed = $1 AND key = $2 ORDER BY id LIMIT 1 FOR UPDATE
), up AS (
    UPDATE {schema}.parked p SET held = false, attempts = 0, first_failure = NULL
      FROM h WHERE NOT $3 AND (p.feed, p.key, p.id) = (h.feed, h.key, h.id)
), del AS (
    DELETE FROM {schema}.parked p USING h
     WHERE $3 AND (p.feed, p.key, p.id) = (h.feed, h.key, h.id)
    RETURNING p.*
), dl AS (
    INSERT INTO {schema}.dead_letters (feed, event_id, topic, key, seq, type, source,
                                       content_type, headers, payload, created_at, reason)
    SELECT feed, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at,
           'skipped by an operator after: ' || reason
      FROM del
    ON CONFLICT (feed, event_id) DO NOTHING
)
SELECT count(*) FROM h`

// sqlParkedByFeed counts the events relays have parked (migration 006),
// per feed: a feed's checkpoint passes them, but they are not delivered.
// O(parked events), which are a stuck key's few.
const sqlParkedByFeed = `SELECT feed, count(*) FROM {schema}.parked GROUP BY feed ORDER BY feed`
