-- Ferry schema version 18: the schema changes of release 0.2, one
-- migration per release (those of 0.1 are 001 to 017).
--
-- (1): a dead-policy change re-evaluates every key of
-- its group, a chunk of keys per transaction; the sweep's progress is
-- stored with the policy, so that a change interrupted part-way (a
-- cancelled request, a killed process, a failed statement) is finished by
-- the next SetInboxPolicy instead of leaving keys held under the old one.
-- sweeping: the sweep is not finished; sweep_after: the last key it
-- re-evaluated (NULL: none yet); sweep_gen: counts policy changes, so that
-- a sweep of an older change cannot record progress for a newer one.
ALTER TABLE {schema}.inbox_groups
    ADD COLUMN sweeping    boolean NOT NULL DEFAULT false,
    ADD COLUMN sweep_after text,
    ADD COLUMN sweep_gen   bigint  NOT NULL DEFAULT 0;

-- (2): a parked key's head keeps its failed attempts
-- and the time of the first (SetParkedAttempts), so that the relay's
-- MaxAttempts and MaxAge count across leaderships instead of starting
-- afresh with each: a relay rebalanced more often than MaxAge gave up on
-- nothing.
ALTER TABLE {schema}.parked
    ADD COLUMN attempts      integer NOT NULL DEFAULT 0,
    ADD COLUMN first_failure timestamptz;

-- (3): producers no longer number a key's events: a transaction-scoped
-- advisory lock per key keeps same-key writers in commit order, and the
-- relay numbers each key's events as it reads them (Seq), saving the keys'
-- last numbers per feed with its checkpoint, in the same transaction
-- (ferrydriver.KeySeqStore): a new leader reading again from the checkpoint
-- gives each event the number it had. Every feed with a checkpoint starts
-- from the keys' numbers so far; the keys table, which every emit updated,
-- goes (a 0.1 producer fails on its absence instead of writing out of
-- order beside 0.2 ones: upgrade producers and relays together).
CREATE TABLE {schema}.feed_seqs (
    feed       text        NOT NULL,
    key        text        NOT NULL,
    seq        bigint      NOT NULL,
    touched_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (feed, key)
) WITH (fillfactor = 80);
INSERT INTO {schema}.feed_seqs (feed, key, seq, touched_at)
SELECT c.feed, k.key, k.seq, k.touched_at FROM {schema}.checkpoints c CROSS JOIN {schema}.keys k;
DROP TABLE {schema}.keys;

-- (4): an idle relay's "wake me" moves from the listeners table into the
-- settings row that every producer statement reads for the partition
-- count (listening[partition + 1]: until when the partition's relay waits
-- for a NOTIFY): reading a second table cost an emit about 15 % of its
-- PostgreSQL CPU.
ALTER TABLE {schema}.settings ADD COLUMN listening timestamptz[] NOT NULL DEFAULT '{}';
DROP TABLE {schema}.listeners;
