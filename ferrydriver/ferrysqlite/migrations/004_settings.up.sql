-- Ferry schema version 4 for SQLite: the outbox's partition count, stored
-- with the schema so that every producer and relay uses the same one. The
-- count is filled in by ferry: the migrating driver's Config.Partitions, or
-- 0 when it has none, in which case an existing outbox keeps the count its
-- relays and producers used (one more than the highest partition with a
-- checkpoint or an event) and a new one gets 1. Change it later with
-- `ferry partitions set` (Driver.SetPartitions). One row; every append reads
-- it in its write transaction, so it always sees the latest.
CREATE TABLE ferry_settings (
    partitions INTEGER NOT NULL CHECK (partitions BETWEEN 1 AND 4096)
);
INSERT INTO ferry_settings (partitions)
SELECT COALESCE(NULLIF({partitions}, 0),
                NULLIF(max(COALESCE((SELECT max(partition) + 1 FROM ferry_checkpoints), 0),
                           COALESCE((SELECT max(partition) + 1 FROM ferry_outbox), 0)), 0),
                1);
