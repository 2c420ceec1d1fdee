-- Ferry schema version 9: dead letters in the order they are listed
-- (newest failure first, then event ID), so that a page of them, first or
-- deep, is a range of this index under any plan. The index on failed_at
-- alone gave that order only with a sort of each failure's batch, and a
-- generic plan (which cannot know the page's size) sorted the whole table
-- instead: 2,589 pages for a page of 50 of 100,000 dead letters
-- (TestConsolePagesAreFlat). This index also serves what that one did.
CREATE INDEX dead_letters_list_idx ON {schema}.dead_letters (failed_at DESC, event_id);
DROP INDEX {schema}.dead_letters_failed_at_idx;
