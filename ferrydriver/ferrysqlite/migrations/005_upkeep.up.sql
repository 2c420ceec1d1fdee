-- Ferry schema version 5 for SQLite: what the relay's retention pass needs
-- so that no table grows with history.

-- Relay dead letters are removed per feed, oldest first, once they are
-- older than RelayConfig.DeadLetterRetention: a range of this index.
CREATE INDEX ferry_dead_letters_feed_failed_at_idx ON ferry_dead_letters (feed, failed_at);

-- The keys table is bounded: the relay forgets a key that has been idle for
-- RelayConfig.KeyRetention and whose events every feed has passed (see
-- PruneKeys), and its next event starts Seq at 1 again. last_id is the
-- key's newest outbox id, touched_at when it was appended (microseconds).
-- Rows written before this migration get the highest outbox id ever drawn
-- and the migration's time: no earlier than the truth.
ALTER TABLE ferry_keys ADD COLUMN last_id INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ferry_keys ADD COLUMN touched_at INTEGER NOT NULL DEFAULT 0;
UPDATE ferry_keys SET
    last_id = COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'ferry_outbox'), 0),
    touched_at = CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER);
