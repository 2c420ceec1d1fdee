\set k random(1, 500)
INSERT INTO walexp.plain (uuid, payload, metadata, created_at, transaction_id) VALUES (gen_random_uuid()::text, convert_to(repeat('x', 240), 'UTF8'), json_build_object('key', 'key-' || :k), now(), pg_current_xact_id());
