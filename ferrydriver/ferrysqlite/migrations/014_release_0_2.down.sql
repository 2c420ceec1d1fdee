ALTER TABLE ferry_inbox ADD COLUMN claimed_by TEXT;
ALTER TABLE ferry_inbox ADD COLUMN claim_expires_at INTEGER;
ALTER TABLE ferry_inbox ADD COLUMN claim_token TEXT;
CREATE INDEX ferry_inbox_processing_idx ON ferry_inbox (group_name, key) WHERE state = 'processing';
CREATE INDEX ferry_inbox_expiring_idx ON ferry_inbox (group_name, claim_expires_at) WHERE state = 'processing';
-- Claimed rows run again: their keys are due now.
UPDATE ferry_inbox_keys SET runnable_at = 0 WHERE claim_token IS NOT NULL OR rescue_at IS NOT NULL;
DROP INDEX ferry_inbox_keys_rescue_idx;
ALTER TABLE ferry_inbox_keys DROP COLUMN rescue_at;
ALTER TABLE ferry_inbox_keys DROP COLUMN suspect_through;
ALTER TABLE ferry_inbox_keys DROP COLUMN claim_expires_at;
ALTER TABLE ferry_inbox_keys DROP COLUMN claim_through;
ALTER TABLE ferry_inbox_keys DROP COLUMN claim_from;
ALTER TABLE ferry_inbox_keys DROP COLUMN claimed_by;
ALTER TABLE ferry_inbox_keys DROP COLUMN claim_token;
ALTER TABLE ferry_parked DROP COLUMN first_failure;
ALTER TABLE ferry_parked DROP COLUMN attempts;
