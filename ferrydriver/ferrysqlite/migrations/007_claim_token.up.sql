-- Ferry schema version 7: every claim of an inbox row has a token of its
-- own, and every later change of the row presents it, so that a stale
-- attempt (one that outlived its claim) cannot finish a newer claim of
-- the same worker.
ALTER TABLE ferry_inbox ADD COLUMN claim_token TEXT;
-- Rows being processed, by claim expiry: a consumer looks here for claims
-- that expired (their worker crashed or outlived them) and rescues them one
-- at a time. Few rows are ever in it.
CREATE INDEX ferry_inbox_expiring_idx ON ferry_inbox (group_name, claim_expires_at) WHERE state = 'processing';
-- A group's unfinished rows by state, for the consumers' gauges, which
-- count each state up to a cap.
CREATE INDEX ferry_inbox_states_idx ON ferry_inbox (group_name, state)
    WHERE state IN ('pending', 'processing', 'failed', 'dead');
