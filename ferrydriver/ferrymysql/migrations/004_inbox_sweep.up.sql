-- Ferry schema version 4 for MySQL: a dead-policy change re-evaluates the
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
