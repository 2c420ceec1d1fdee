-- Ferry schema version 12 (the console's pages): a group's rows of one state in the order the
-- console lists them (newest finished, then newest received, first), so
-- that a page of them is a range of an index however many there are:
-- - every state but PROCESSED, by state (a page of PENDING or FAILED rows
--   sorted all of them, and DISCARDED and RETRACTED rows had no index;
--   this index keeps serving the consumers' counts by state, as the index
--   of migration 7 did, and serves DEAD rows' pages and groupings by
--   reason, as the index of migration 2 on (group_name, finished_at) did);
-- - PROCESSED rows by finish with the order's tie-breaks (with finished_at
--   alone, the planner scanned the table and sorted it for a page).
CREATE INDEX ferry_inbox_state_pages_idx ON ferry_inbox (group_name, state, finished_at, received_at, event_id)
    WHERE state <> 'processed';
DROP INDEX ferry_inbox_states_idx;
CREATE INDEX ferry_inbox_processed_pages_idx ON ferry_inbox (group_name, finished_at, received_at, event_id) WHERE state = 'processed';
DROP INDEX ferry_inbox_processed_idx;
DROP INDEX ferry_inbox_dead_idx;
-- A key's relay dead letters (the console's key page), newest first: a
-- page of them was a walk of every dead letter.
CREATE INDEX ferry_dead_letters_key_idx ON ferry_dead_letters (key, failed_at DESC, event_id);
