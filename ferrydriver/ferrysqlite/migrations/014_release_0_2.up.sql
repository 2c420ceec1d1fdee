-- Ferry schema version 14 for SQLite: the schema changes of release 0.2,
-- one migration per release (those of 0.1 are 001 to 013).
--
-- (1): a parked key's head keeps its failed attempts and the time of the
-- first (SetParkedAttempts, in microseconds; 0: none), so that the relay's
-- MaxAttempts and MaxAge count across leaderships instead of starting
-- afresh with each.
ALTER TABLE ferry_parked ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ferry_parked ADD COLUMN first_failure INTEGER NOT NULL DEFAULT 0;

-- (2): claims by key, as ferrypg's (its migration 011). A consumer claims
-- a run of a key's rows (its next rows in order) on the key's row, with
-- one token, one expiry and the range of positions it covers, instead of
-- marking each inbox row PROCESSING: an event then costs one write of its
-- inbox row (its outcome). PROCESSING is no longer stored: a PENDING or
-- FAILED row inside its key's claim (claim_from < pos <= claim_through)
-- reads as PROCESSING, its attempt counted.
--
-- suspect_through: after a claim expired (its process crashed, or its
-- handler outlived it), the rows it covered run one at a time, each alone,
-- through rescues, up to this position: an event that crashes its process
-- costs no other event an attempt.
-- rescue_at: when a rescue may take the key (a claim's expiry, or the
-- next suspect row's time); NULL otherwise. runnable_at is when an
-- ordinary claim may take the key, NULL while it is claimed or suspect.
ALTER TABLE ferry_inbox_keys ADD COLUMN claim_token TEXT;
ALTER TABLE ferry_inbox_keys ADD COLUMN claimed_by TEXT;
ALTER TABLE ferry_inbox_keys ADD COLUMN claim_from INTEGER;
ALTER TABLE ferry_inbox_keys ADD COLUMN claim_through INTEGER;
ALTER TABLE ferry_inbox_keys ADD COLUMN claim_expires_at INTEGER;
ALTER TABLE ferry_inbox_keys ADD COLUMN suspect_through INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ferry_inbox_keys ADD COLUMN rescue_at INTEGER;
CREATE INDEX ferry_inbox_keys_rescue_idx ON ferry_inbox_keys (group_name, rescue_at) WHERE rescue_at IS NOT NULL;

-- Rows claimed under schema 13 run again (their attempt was counted when
-- they were claimed); their keys are due now.
UPDATE ferry_inbox_keys SET runnable_at = 0, held_by = NULL
 WHERE (group_name, key) IN (SELECT group_name, key FROM ferry_inbox WHERE state = 'processing');
UPDATE ferry_inbox SET state = 'pending' WHERE state = 'processing';
DROP INDEX ferry_inbox_processing_idx;
DROP INDEX ferry_inbox_expiring_idx;
ALTER TABLE ferry_inbox DROP COLUMN claimed_by;
ALTER TABLE ferry_inbox DROP COLUMN claim_expires_at;
ALTER TABLE ferry_inbox DROP COLUMN claim_token;
