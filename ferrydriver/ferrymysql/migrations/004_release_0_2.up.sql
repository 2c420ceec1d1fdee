-- Ferry schema version 4 for MySQL: the schema changes of release 0.2,
-- one migration per release (those of 0.1 are 001 to 003).
--
-- (1) for MySQL: a dead-policy change re-evaluates the
-- keys of its group a chunk per transaction; the sweep's progress is
-- stored with the policy, so that a change interrupted part-way (a
-- cancelled request, a killed process, a failed statement) is finished by
-- the next SetInboxPolicy instead of leaving keys under the old one.
-- sweeping: the sweep is not finished; sweep_after: the last key it
-- reached (NULL: none yet); sweep_gen: counts policy changes, so that a
-- sweep of an older change records no progress for a newer one.
ALTER TABLE ferry_inbox_groups
    ADD COLUMN sweeping    BOOLEAN         NOT NULL DEFAULT FALSE,
    ADD COLUMN sweep_after VARBINARY(1024) NULL,
    ADD COLUMN sweep_gen   BIGINT          NOT NULL DEFAULT 0;

-- (2) for MySQL: a parked key's head keeps its failed
-- attempts and the time of the first (SetParkedAttempts, in microseconds;
-- 0: none), so that the relay's MaxAttempts and MaxAge count across
-- leaderships instead of starting afresh with each.
ALTER TABLE ferry_parked
    ADD COLUMN attempts      INT    NOT NULL DEFAULT 0,
    ADD COLUMN first_failure BIGINT NOT NULL DEFAULT 0;
