\set k random(1, 500)
WITH locked AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtext('"walexp"'), hashtext('key-' || :k)), pg_current_xact_id(),
           (SELECT pg_notify('ferry.' || 0, '') WHERE listening[0 + 1] > now())
      FROM walexp.settings WHERE partitions = 1
)
INSERT INTO walexp.outbox (partition, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at)
SELECT 0, gen_random_uuid(), 'orders', 'key-' || :k, 0, 'OrderPlaced', 'bench', '', NULL, convert_to(repeat('x', 240), 'UTF8'), now()
  FROM locked;
