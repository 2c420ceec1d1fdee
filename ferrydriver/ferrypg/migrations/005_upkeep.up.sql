-- Ferry schema version 5: what the relay's retention pass needs so that
-- no table grows with history.

-- Relay dead letters are removed per feed, oldest first, once they are
-- older than RelayConfig.DeadLetterRetention: a range of this index, O(chunk)
-- however many are kept (see sqlDeleteDeadLetters).
CREATE INDEX dead_letters_feed_failed_at_idx ON {schema}.dead_letters (feed, failed_at);

-- The keys table is bounded: the relay forgets a key that has been idle for
-- RelayConfig.KeyRetention and whose events every feed has delivered (see
-- PruneKeys), and its next event starts Seq at 1 again. xid is the
-- transaction that last appended to the key, which tells whether its events
-- were delivered; touched_at is when, which tells how long it has been
-- idle. Neither is indexed, so that appends keep updating the row in place
-- (HOT); the relay sweeps the table in primary-key order instead. Rows
-- written before this migration get the migration's transaction id (ALTER
-- TABLE waits for every transaction that holds one of them) and its time:
-- no earlier than the truth. Both defaults are constants, so the table is
-- not rewritten.
DO $$
BEGIN
    EXECUTE format('ALTER TABLE {schema}.keys ADD COLUMN xid xid8 NOT NULL DEFAULT %L::xid8, '
                   'ADD COLUMN touched_at timestamptz NOT NULL DEFAULT %L::timestamptz',
                   pg_current_xact_id(), now());
END $$;
