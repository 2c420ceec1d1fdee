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

-- (3) for MySQL: claims by key, as PostgreSQL's and SQLite's. A consumer
-- claims a run of a key's rows (its next rows in order) on the key's row,
-- with one token, one expiry and the range of positions it covers,
-- instead of marking each inbox row PROCESSING: an event then costs one
-- write of its inbox row after ingestion (its outcome). PROCESSING is no
-- longer stored: a PENDING or FAILED row inside its key's claim
-- (claim_from < pos <= claim_through) reads as PROCESSING.
-- suspect_through: after a claim expired (its process crashed, or its
-- handler outlived it), the rows it covered run one at a time, each alone,
-- through rescues, up to this position.
-- rescue_at: when a rescue may take the key (a claim's expiry, or the
-- next suspect row's time); NULL otherwise. runnable_at is when an
-- ordinary claim may take the key, NULL while it is claimed or suspect.
ALTER TABLE ferry_inbox_keys
    ADD COLUMN claim_token      BINARY(16)     NULL,
    ADD COLUMN claimed_by       VARBINARY(255) NULL,
    ADD COLUMN claim_from       BIGINT         NULL,
    ADD COLUMN claim_through    BIGINT         NULL,
    ADD COLUMN claim_expires_at BIGINT         NULL,
    ADD COLUMN suspect_through  BIGINT         NOT NULL DEFAULT 0,
    ADD COLUMN rescue_at        BIGINT         NULL,
    ADD KEY ferry_inbox_keys_rescue_idx (group_name, rescue_at);

-- Rows claimed under schema 3 run again (their attempt was counted when
-- they were claimed); their keys are due now.
UPDATE ferry_inbox_keys k JOIN (SELECT DISTINCT group_name, k FROM ferry_inbox WHERE state = 'processing') p
    ON p.group_name = k.group_name AND p.k = k.k
   SET k.runnable_at = 0, k.held_by = NULL;
UPDATE ferry_inbox SET state = 'pending' WHERE state = 'processing';
ALTER TABLE ferry_inbox DROP COLUMN claimed_by, DROP COLUMN claim_token, DROP COLUMN claim_expires_at;
