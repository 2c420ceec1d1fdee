DROP INDEX ferry_inbox_states_idx;
DROP INDEX ferry_inbox_expiring_idx;
ALTER TABLE ferry_inbox DROP COLUMN claim_token;
