\set k random(1, 500)
WITH s AS (SELECT partitions FROM walexp.settings),
ok AS (SELECT 1 FROM s WHERE partitions = 1),
k AS (
    INSERT INTO walexp.keys01 AS k (key, seq, xid, touched_at)
    SELECT 'key-' || :k, 1, pg_current_xact_id(), statement_timestamp() WHERE EXISTS (SELECT FROM ok)
    ON CONFLICT (key) DO UPDATE SET seq = k.seq + 1, xid = excluded.xid, touched_at = excluded.touched_at
    RETURNING k.seq
),
ins AS (
    INSERT INTO walexp.outbox (partition, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at)
    SELECT 0, gen_random_uuid(), 'orders', 'key-' || :k, k.seq, 'OrderPlaced', 'bench', '', NULL, convert_to(repeat('x', 240), 'UTF8'), now()
      FROM k
    RETURNING partition
)
SELECT (SELECT count(*) FROM ins), (SELECT partitions FROM s),
       (SELECT count(pg_notify('ferry.' || l.partition, ''))
          FROM walexp.listeners01 l
         WHERE l.until > now() AND l.partition IN (SELECT partition FROM ins));
