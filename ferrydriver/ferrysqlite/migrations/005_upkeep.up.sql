-- Ferry schema version 5 for SQLite: what the relay's retention pass needs
-- so that no table grows with history.

-- Relay dead letters are removed per feed, oldest first, once they are
-- older than RelayConfig.DeadLetterRetention: a range of this index.
CREATE INDEX ferry_dead_letters_feed_failed_at_idx ON ferry_dead_letters (feed, failed_at);
