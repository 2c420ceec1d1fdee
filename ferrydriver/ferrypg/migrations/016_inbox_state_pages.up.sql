-- Ferry schema version 16: a group's rows of one state in the order the
-- console lists them (newest finished, then newest received, first), so
-- that a page of a group's PENDING, FAILED, DISCARDED or RETRACTED events
-- is a range of this index however many there are. The index of migration
-- 7 on (group_name, state) gave the rows, not their order: a page of 50 of
-- 180,000 PENDING events sorted them all (138 ms), and DISCARDED and
-- RETRACTED rows had no index at all. It keeps serving the consumers'
-- counts by state. PROCESSED rows, by far the most, are left out: they
-- have inbox_processed_idx, and a finish does not write this index.
--
-- The states are listed, not written "state <> 'processed'": a statement
-- on the consumers' path that names a row by event ID and excludes
-- finished states ("state NOT IN ('processed', ...)") would imply that
-- condition, and its generic plan, made on an empty inbox, walked this
-- index over the whole group (TestInboxPlansOnAnEmptyInbox). event_id,
-- the order's last tie-break, is in the index: the rows of one ingestion
-- share their received_at, and a page of a backlog ingested at once
-- sorted all of them without it.
CREATE INDEX inbox_state_pages_idx ON {schema}.inbox (group_name, state, finished_at, received_at, event_id)
    WHERE state IN ('pending', 'processing', 'failed', 'dead', 'discarded', 'retracted');
DROP INDEX {schema}.inbox_states_idx;
