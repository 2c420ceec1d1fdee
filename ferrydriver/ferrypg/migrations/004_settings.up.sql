-- Ferry schema version 4: the outbox's partition count, stored with the
-- schema so that every producer and relay uses the same one. The schema name
-- and the count are filled in by ferry: the count of the migrating driver's
-- Config.Partitions (`ferry migrate up --partitions N`), or 0 when it has
-- none, in which case an existing outbox keeps the count its relays and
-- producers used (one more than the highest partition with a checkpoint or
-- an event) and a new one gets 1. Change it later with `ferry partitions set`
-- (ferrypg's Driver.SetPartitions), never by hand while producers run.
--
-- One row. Every append reads it in its own statement and writes nothing
-- when it differs from the count the producer computed partitions with;
-- SetPartitions replaces the row with TRUNCATE, which waits for every
-- producer transaction that read it and leaves a snapshot taken before the
-- change seeing no row at all rather than the old count. No index: an
-- index would be one more lock for every producer statement.
CREATE TABLE {schema}.settings (
    partitions integer NOT NULL CHECK (partitions BETWEEN 1 AND 4096)
);
INSERT INTO {schema}.settings (partitions)
SELECT COALESCE(NULLIF({partitions}, 0),
                GREATEST((SELECT max(partition) + 1 FROM {schema}.checkpoints),
                         (SELECT partition + 1 FROM {schema}.outbox ORDER BY partition DESC LIMIT 1)),
                1);
