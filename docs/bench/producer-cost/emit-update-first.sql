\set k random(1, 500)
WITH s AS (SELECT partitions FROM walexp.settings),
ok AS (SELECT 1 FROM s WHERE partitions = 1),
u AS (
    UPDATE walexp.keys01 SET seq = seq + 1, xid = pg_current_xact_id(), touched_at = statement_timestamp()
     WHERE key = 'key-' || :k AND EXISTS (SELECT FROM ok)
    RETURNING seq
),
n AS (
    INSERT INTO walexp.keys01 AS k (key, seq, xid, touched_at)
    SELECT 'key-' || :k, 1, pg_current_xact_id(), statement_timestamp() WHERE EXISTS (SELECT FROM ok) AND NOT EXISTS (SELECT FROM u)
    ON CONFLICT (key) DO UPDATE SET seq = k.seq + 1, xid = excluded.xid, touched_at = excluded.touched_at
    RETURNING k.seq
),
k AS (SELECT seq FROM u UNION ALL SELECT seq FROM n),
ins AS (
    INSERT INTO walexp.outbox (partition, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at)
    SELECT 0, gen_random_uuid(), 'orders', 'key-' || :k, k.seq, 'OrderPlaced', 'bench', '', NULL, convert_to(repeat('x', 240), 'UTF8'), now()
      FROM k
    RETURNING partition
)
SELECT (SELECT count(*) FROM ins), (SELECT partitions FROM s);
