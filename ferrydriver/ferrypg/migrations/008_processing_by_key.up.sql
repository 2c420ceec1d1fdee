-- Ferry schema version 8: rows being processed, by key. Claims and key
-- refreshes ask, for each key they touch, whether another row of the key
-- runs and until when. With the index of migration 7, which has no key,
-- each of those questions read every row being processed in the group: a
-- batch of 32 keys, with 8 workers of 32 events in flight, read some 8,000
-- rows, and refreshing a batch's keys cost 5 ms. Led by the key, each is a
-- lookup. Rescues (claims that expired) still find theirs here: they read
-- the group's rows in flight, few by nature, and not per key.
CREATE INDEX inbox_processing_key_idx ON {schema}.inbox (group_name, key, claim_expires_at) WHERE state = 'processing';
DROP INDEX {schema}.inbox_processing_idx;
