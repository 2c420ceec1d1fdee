-- Ferry schema version 2 for SQLite: consumer inboxes.

-- One row per (consumer group, event). pos is the ingestion order; for one
-- key it is the delivery order, and rows of a key run in pos order.
CREATE TABLE ferry_inbox (
    pos              INTEGER PRIMARY KEY AUTOINCREMENT,
    group_name       TEXT    NOT NULL,
    event_id         TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    seq              INTEGER NOT NULL DEFAULT 0,
    topic            TEXT    NOT NULL,
    type             TEXT    NOT NULL,
    source           TEXT    NOT NULL DEFAULT '',
    content_type     TEXT    NOT NULL DEFAULT '',
    headers          TEXT,
    payload          BLOB    NOT NULL,
    created_at       INTEGER NOT NULL,
    state            TEXT    NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'processing', 'processed', 'failed', 'dead', 'discarded', 'retracted')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    next_attempt_at  INTEGER NOT NULL,
    claimed_by       TEXT,
    claim_expires_at INTEGER,
    received_at      INTEGER NOT NULL,
    finished_at      INTEGER,
    UNIQUE (group_name, event_id)
);

-- A key's unfinished rows in order: its head is the first.
CREATE INDEX ferry_inbox_unfinished_idx ON ferry_inbox (group_name, key, pos)
    WHERE state IN ('pending', 'processing', 'failed', 'dead');
-- A key's running rows: claims must never run two rows of a key at once.
CREATE INDEX ferry_inbox_processing_idx ON ferry_inbox (group_name, key) WHERE state = 'processing';
CREATE INDEX ferry_inbox_processed_idx ON ferry_inbox (group_name, finished_at) WHERE state = 'processed';
CREATE INDEX ferry_inbox_dead_idx ON ferry_inbox (group_name, finished_at) WHERE state = 'dead';

-- One row per (group, key) that has or had work: when its head may run
-- (NULL: nothing to run, or held_by names the DEAD row holding the key).
CREATE TABLE ferry_inbox_keys (
    group_name  TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    runnable_at INTEGER,
    held_by     TEXT,
    PRIMARY KEY (group_name, key)
) WITHOUT ROWID;
CREATE INDEX ferry_inbox_keys_runnable_idx ON ferry_inbox_keys (group_name, runnable_at)
    WHERE runnable_at IS NOT NULL;

-- Each group's dead policy (1: hold a key's later rows behind a DEAD row).
CREATE TABLE ferry_inbox_groups (
    group_name TEXT    PRIMARY KEY,
    hold_dead  INTEGER NOT NULL
);
