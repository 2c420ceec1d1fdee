package ferrypg

// SQL of the relay's dead letters: writing, listing, counting,
// redriving, discarding and their retention. {schema} is replaced by the
// quoted schema name.

const sqlInsertDeadLetters = `
WITH lease AS (
    SELECT 1 FROM {schema}.leases
     WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > now()
     FOR SHARE
), ins AS (
    INSERT INTO {schema}.dead_letters (feed, event_id, topic, key, seq, type, source,
                                       content_type, headers, payload, created_at, reason)
    SELECT $1, t.event_id, t.topic, t.key, t.seq, t.type, t.source, t.content_type,
           NULLIF(t.headers, '')::jsonb, t.payload, t.created_at, t.reason
      FROM unnest($4::uuid[], $5::text[], $6::text[], $7::bigint[], $8::text[],
                  $9::text[], $10::text[], $11::text[], $12::bytea[],
                  $13::timestamptz[], $14::text[])
           AS t(event_id, topic, key, seq, type, source, content_type, headers, payload, created_at, reason)
     WHERE EXISTS (SELECT 1 FROM lease)
    ON CONFLICT (feed, event_id) DO NOTHING
)
SELECT count(*) FROM lease`

const deadLetterColumns = `feed, event_id, topic, key, seq, type, source, content_type, headers::text, payload, created_at, reason, failed_at`

// deadLetterFilter selects dead letters by feed $1 ({feed}: a partition,
// exactly, or a feed's partitions, see familyFeed), key $2, type $3, topic
// $4, failed at or after $5 and before $6, event IDs $7, and a reason
// containing $8 (each when set). For operators: no index serves every
// combination; a partition, a key and the failure time are served
// (dead_letters_feed_failed_at_idx, dead_letters_key_idx,
// dead_letters_list_idx), a feed's partitions are matched along the list.
const deadLetterFilter = `
       {feed} AND ($2 = '' OR key = $2) AND ($3 = '' OR type = $3)
   AND ($4 = '' OR topic = $4)
   AND ($5::timestamptz IS NULL OR failed_at >= $5) AND ($6::timestamptz IS NULL OR failed_at < $6)
   AND (cardinality($7::uuid[]) = 0 OR event_id = ANY ($7::uuid[]))
   AND ($8 = '' OR strpos(reason, $8) > 0)`

// The feed terms of deadLetterFilter: a partition $1 (any when empty), or the
// partitions of a feed, $1 being the feed's name and a slash ("hooks/")
// followed by a partition number. A statement of each is prepared.
const (
	exactFeed  = `($1 = '' OR feed = $1)`
	familyFeed = `(left(feed, length($1)) = $1 AND substr(feed, length($1) + 1) ~ '^[0-9]+$')`
)

// sqlListDeadLetters lists them newest failure first, after the cursor
// ($10, $11; 'infinity' and the nil UUID for the first page), $9 at
// most. The cursor is always there, and "failed_at <= $10" first, so that
// under any plan a page is a range of dead_letters_list_idx (migration
// 009) that starts where the page begins, instead of a filter over every
// newer row (TestConsolePagesAreFlat).
const sqlListDeadLetters = `
SELECT ` + deadLetterColumns + ` FROM {schema}.dead_letters
 WHERE ` + deadLetterFilter + `
   AND failed_at <= $10::text::timestamptz AND (failed_at < $10::text::timestamptz OR event_id > $11::uuid)
 ORDER BY failed_at DESC, event_id LIMIT $9`

// sqlCountMatchingDeadLetters counts what sqlListDeadLetters lists,
// every match (`ferry dlq list`'s "showing 100 of 2,096").
const sqlCountMatchingDeadLetters = `SELECT count(*) FROM {schema}.dead_letters WHERE ` + deadLetterFilter

// sqlSelectRedrive locks the named dead letters ($1 feeds, $2 event IDs)
// to redrive, oldest failure first and, within a failure (one relay
// batch), in the key's order. A concurrent redrive of the same ones waits
// and then finds them gone.
const sqlSelectRedrive = `
SELECT ` + deadLetterColumns + ` FROM {schema}.dead_letters
 WHERE (feed, event_id) IN (SELECT f, e FROM unnest($1::text[], $2::uuid[]) AS s(f, e))
 ORDER BY failed_at, seq, event_id FOR UPDATE`

// sqlDeleteDeadLetterRefs removes the named dead letters ($1 feeds, $2
// event IDs): a discard, or a redrive's in its transaction.
const sqlDeleteDeadLetterRefs = `
DELETE FROM {schema}.dead_letters d USING unnest($1::text[], $2::uuid[]) AS s(feed, event_id)
 WHERE d.feed = s.feed AND d.event_id = s.event_id`

// sqlGetDeadLetter reads an event's newest dead letter, of feed $1 when
// set ({feed}, as in deadLetterFilter).
const sqlGetDeadLetter = `
SELECT ` + deadLetterColumns + ` FROM {schema}.dead_letters
 WHERE {feed} AND event_id = $2 ORDER BY failed_at DESC LIMIT 1`

// sqlDeleteDeadLetters removes a feed's dead letters older than the
// retention, oldest first, $3 at a time: a range of
// dead_letters_feed_failed_at_idx (migration 005), O($3) however many are
// kept. It runs in an index-plan transaction (inIndexPlanTx). Over 100,000
// dead letters analysed as none: 2 buffers when none is old enough (below),
// 505 for a chunk of 100 when all are (TestDeadLetterRetentionIsBounded):
//
//	Delete on dead_letters d
//	  -> Nested Loop
//	       -> Subquery Scan on s -> Limit
//	            -> Index Scan using dead_letters_feed_failed_at_idx on dead_letters
//	                 Index Cond: ((feed = 'dl/0'::text) AND (failed_at < (now() - '01:00:00'::interval)))
//	       -> Index Scan using dead_letters_pkey on dead_letters d  Index Cond: ((feed = s.feed) AND (event_id = s.event_id))
const sqlDeleteDeadLetters = `
DELETE FROM {schema}.dead_letters d USING (
    SELECT feed, event_id FROM {schema}.dead_letters
     WHERE feed = $1 AND failed_at < now() - $2 * interval '1 millisecond'
     ORDER BY failed_at LIMIT $3) s
 WHERE d.feed = s.feed AND d.event_id = s.event_id`

// sqlCountDeadLetters counts a feed's dead letters, at most $2 of them: an
// index-only range of the primary key, O($2).
const sqlCountDeadLetters = `
SELECT count(*), now() FROM (SELECT 1 FROM {schema}.dead_letters WHERE feed = $1 LIMIT $2) d`

// sqlCountDeadLettersExact counts all of them (`ferry status --exact`).
const sqlCountDeadLettersExact = `SELECT count(*), now() FROM {schema}.dead_letters WHERE feed = $1`
