-- Ferry schema version 7: every claim of an inbox row has a token of its
-- own, and every later change of the row presents it, so that a stale
-- attempt (one that outlived its claim) cannot finish a newer claim of
-- the same worker.
ALTER TABLE {schema}.inbox ADD COLUMN claim_token uuid;
-- Rows being processed, by claim expiry: a consumer looks here for claims
-- that expired (their worker crashed or outlived them) and rescues them one
-- at a time, and claims and completions ask here whether another row of a
-- key runs (they used to walk the key's whole backlog in
-- inbox_unfinished_idx: draining a hot key was O(n²)). Few rows are ever
-- in it.
CREATE INDEX inbox_processing_idx ON {schema}.inbox (group_name, claim_expires_at) WHERE state = 'processing';
-- A group's unfinished rows by state, for the consumers' gauges, which
-- count each state up to a cap (they used to count every unfinished row of
-- every group, every 15 s, in every consumer process).
CREATE INDEX inbox_states_idx ON {schema}.inbox (group_name, state)
    WHERE state IN ('pending', 'processing', 'failed', 'dead');
