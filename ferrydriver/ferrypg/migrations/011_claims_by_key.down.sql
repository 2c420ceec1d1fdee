DROP FUNCTION {schema}.inbox_claims_held(bigint, bigint);
ALTER TABLE {schema}.inbox ADD COLUMN claimed_by text, ADD COLUMN claim_expires_at timestamptz, ADD COLUMN claim_token uuid;
CREATE INDEX inbox_processing_key_idx ON {schema}.inbox (group_name, key, claim_expires_at) WHERE state = 'processing';
-- Claims in flight end: their rows run again.
UPDATE {schema}.inbox_keys SET runnable_at = now()
 WHERE claim_token IS NOT NULL OR (rescue_at IS NOT NULL AND held_by IS NULL);
DROP INDEX {schema}.inbox_keys_rescue_idx;
ALTER TABLE {schema}.inbox_keys
    DROP COLUMN done_pos, DROP COLUMN tail_pos, DROP COLUMN claim_token, DROP COLUMN claimed_by,
    DROP COLUMN claim_from, DROP COLUMN claim_through, DROP COLUMN claim_expires_at,
    DROP COLUMN suspect_through, DROP COLUMN rescue_at;
