CREATE INDEX inbox_states_idx ON {schema}.inbox (group_name, state)
    WHERE state IN ('pending', 'processing', 'failed', 'dead');
DROP INDEX {schema}.inbox_state_pages_idx;
