ALTER TABLE ferry_inbox
    ADD COLUMN claimed_by       VARBINARY(255) NULL,
    ADD COLUMN claim_token      BINARY(16)     NULL,
    ADD COLUMN claim_expires_at BIGINT         NULL;
-- Claimed rows run again: their keys are due now.
UPDATE ferry_inbox_keys SET runnable_at = 0 WHERE claim_token IS NOT NULL OR rescue_at IS NOT NULL;
ALTER TABLE ferry_inbox_keys
    DROP KEY ferry_inbox_keys_rescue_idx,
    DROP COLUMN claim_token, DROP COLUMN claimed_by, DROP COLUMN claim_from, DROP COLUMN claim_through,
    DROP COLUMN claim_expires_at, DROP COLUMN suspect_through, DROP COLUMN rescue_at;
ALTER TABLE ferry_parked DROP COLUMN attempts, DROP COLUMN first_failure;
ALTER TABLE ferry_inbox_groups DROP COLUMN sweeping, DROP COLUMN sweep_after, DROP COLUMN sweep_gen;
