-- Ferry schema version 1 for SQLite: outbox, per-key sequences, relay
-- checkpoints, leases and relay dead letters. Times are microseconds since
-- the Unix epoch (UTC).

-- One row per emitted event. SQLite has one writer at a time and a writer
-- holds the lock from its first write to its commit, so ids are drawn in
-- commit order: the feed reads "id > cursor" and skips nothing. AUTOINCREMENT
-- is required: without it SQLite may reuse the ids of deleted rows, which a
-- feed past them would never read.
CREATE TABLE ferry_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    partition    INTEGER NOT NULL DEFAULT 0,
    event_id     TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    type         TEXT    NOT NULL,
    source       TEXT    NOT NULL DEFAULT '',
    content_type TEXT    NOT NULL DEFAULT '',
    headers      TEXT,
    payload      BLOB    NOT NULL,
    created_at   INTEGER NOT NULL
);
CREATE INDEX ferry_outbox_partition_idx ON ferry_outbox (partition, id);

-- Per-key sequence numbers, gapless: a rolled-back append rolls its
-- increment back too.
CREATE TABLE ferry_keys (
    key TEXT    PRIMARY KEY,
    seq INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE ferry_checkpoints (
    feed       TEXT    PRIMARY KEY,
    partition  INTEGER NOT NULL DEFAULT 0,
    cursor     BLOB,
    term       INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL
);

CREATE TABLE ferry_leases (
    name       TEXT    PRIMARY KEY,
    holder     TEXT    NOT NULL,
    term       INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE ferry_dead_letters (
    feed         TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    type         TEXT    NOT NULL,
    source       TEXT    NOT NULL,
    content_type TEXT    NOT NULL,
    headers      TEXT,
    payload      BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    reason       TEXT    NOT NULL,
    failed_at    INTEGER NOT NULL,
    PRIMARY KEY (feed, event_id)
);
CREATE INDEX ferry_dead_letters_failed_at_idx ON ferry_dead_letters (failed_at);
