-- Ferry schema version 8: dead letters in the order the console and
-- `ferry dlq list` list them (newest failure first, then event ID), so that
-- a page walks this index from its start instead of sorting the table.
CREATE INDEX ferry_dead_letters_list_idx ON ferry_dead_letters (failed_at DESC, event_id);
