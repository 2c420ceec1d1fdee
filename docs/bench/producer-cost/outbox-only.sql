\set k random(1, 500)
INSERT INTO walexp.outbox (partition, event_id, topic, key, seq, type, source, content_type, headers, payload, created_at)
VALUES (0, gen_random_uuid(), 'orders', 'key-' || :k, 0, 'OrderPlaced', 'bench', '', NULL, convert_to(repeat('x', 240), 'UTF8'), now());
