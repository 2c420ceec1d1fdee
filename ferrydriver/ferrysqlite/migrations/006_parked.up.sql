-- Ferry schema version 6 for SQLite: parked events. When a key's
-- destination stops acknowledging it while other keys flow, the relay moves
-- the key's events here (fenced by its lease) so that its checkpoint can
-- pass them, and publishes them from here, in id order per key, once the
-- key recovers.
CREATE TABLE ferry_parked (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    feed         TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    type         TEXT    NOT NULL,
    source       TEXT    NOT NULL,
    content_type TEXT    NOT NULL,
    headers      TEXT,
    payload      BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    parked_at    INTEGER NOT NULL,
    held         INTEGER NOT NULL DEFAULT 0,
    reason       TEXT    NOT NULL DEFAULT ''
);
-- A key's head is its first row by id.
CREATE INDEX ferry_parked_key_idx ON ferry_parked (feed, key, id);
-- An event is parked once per feed, and removed by its ID.
CREATE UNIQUE INDEX ferry_parked_event_idx ON ferry_parked (feed, event_id);
