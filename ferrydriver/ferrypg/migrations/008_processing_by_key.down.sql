CREATE INDEX inbox_processing_idx ON {schema}.inbox (group_name, claim_expires_at) WHERE state = 'processing';
DROP INDEX {schema}.inbox_processing_key_idx;
