DROP INDEX {schema}.inbox_states_idx;
DROP INDEX {schema}.inbox_processing_idx;
ALTER TABLE {schema}.inbox DROP COLUMN claim_token;
