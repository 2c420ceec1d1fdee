CREATE INDEX ferry_inbox_states_idx ON ferry_inbox (group_name, state)
    WHERE state IN ('pending', 'processing', 'failed', 'dead');
DROP INDEX ferry_inbox_state_pages_idx;
CREATE INDEX ferry_inbox_processed_idx ON ferry_inbox (group_name, finished_at) WHERE state = 'processed';
DROP INDEX ferry_inbox_processed_pages_idx;
CREATE INDEX ferry_inbox_dead_idx ON ferry_inbox (group_name, finished_at) WHERE state = 'dead';
DROP INDEX ferry_dead_letters_key_idx;
