-- Ferry schema version 1 for MySQL and MariaDB: the outbox, per-key
-- sequences, relay checkpoints, leases, relay dead letters, the stored
-- partition count and parked events. Text is stored as bytes (VARBINARY,
-- LONGBLOB): a key or a topic comes back byte for byte, and two keys that
-- a collation would call equal stay two keys. Times are microseconds since
-- the Unix epoch (UTC), taken from the server's clock.

-- One row per emitted event. id is only the row's identity: the feed reads
-- the binlog, in commit order, not "id > cursor" (ids are drawn when a row
-- is written, not when its transaction commits). appended_at is the
-- server's time of the write; recovery from a purged binlog and retention
-- read by it.
CREATE TABLE ferry_outbox (
    id           BIGINT          NOT NULL AUTO_INCREMENT,
    p            INT             NOT NULL DEFAULT 0,
    event_id     BINARY(16)      NOT NULL,
    topic        VARBINARY(200)  NOT NULL,
    k            VARBINARY(1024) NOT NULL,
    seq          BIGINT          NOT NULL,
    type         VARBINARY(256)  NOT NULL,
    source       VARBINARY(1024) NOT NULL DEFAULT '',
    content_type VARBINARY(255)  NOT NULL DEFAULT '',
    headers      LONGBLOB        NULL,
    payload      LONGBLOB        NOT NULL,
    created_at   BIGINT          NOT NULL,
    appended_at  BIGINT          NOT NULL,
    PRIMARY KEY (id),
    -- A partition read key by key, each key in order: the snapshot scans
    -- (a feed's first read, recovery from a purged binlog).
    KEY ferry_outbox_key_idx (p, k, seq),
    -- Retention, lag and status.
    KEY ferry_outbox_appended_idx (p, appended_at)
) ENGINE=InnoDB;

-- Per-key sequence. An append takes its key's next numbers with an UPDATE
-- of the key's row (created beforehand if missing, see store.go), which
-- locks it until the transaction ends: same-key producers serialise, so the
-- one that commits first has the lower numbers and comes first in the
-- binlog; other keys never wait. touched_at is the last append's time, for
-- PruneKeys.
CREATE TABLE ferry_keys (
    k          VARBINARY(1024) NOT NULL,
    seq        BIGINT          NOT NULL,
    touched_at BIGINT          NOT NULL,
    PRIMARY KEY (k)
) ENGINE=InnoDB;

CREATE TABLE ferry_checkpoints (
    feed       VARBINARY(255) NOT NULL,
    p          INT            NOT NULL DEFAULT 0,
    pos        BLOB           NULL,
    term       BIGINT         NOT NULL DEFAULT 0,
    updated_at BIGINT         NOT NULL,
    PRIMARY KEY (feed)
) ENGINE=InnoDB;

CREATE TABLE ferry_leases (
    name       VARBINARY(255) NOT NULL,
    holder     VARBINARY(255) NOT NULL,
    term       BIGINT         NOT NULL,
    expires_at BIGINT         NOT NULL,
    PRIMARY KEY (name)
) ENGINE=InnoDB;

CREATE TABLE ferry_dead_letters (
    feed         VARBINARY(255)  NOT NULL,
    event_id     BINARY(16)      NOT NULL,
    topic        VARBINARY(200)  NOT NULL,
    k            VARBINARY(1024) NOT NULL,
    seq          BIGINT          NOT NULL,
    type         VARBINARY(256)  NOT NULL,
    source       VARBINARY(1024) NOT NULL,
    content_type VARBINARY(255)  NOT NULL,
    headers      LONGBLOB        NULL,
    payload      LONGBLOB        NOT NULL,
    created_at   BIGINT          NOT NULL,
    reason       LONGBLOB        NOT NULL,
    failed_at    BIGINT          NOT NULL,
    PRIMARY KEY (feed, event_id),
    -- Pages in the order they are listed (newest failure first), a key's,
    -- and a feed's oldest first for retention.
    KEY ferry_dead_letters_list_idx (failed_at DESC, event_id),
    KEY ferry_dead_letters_key_idx (k, failed_at DESC, event_id),
    KEY ferry_dead_letters_feed_idx (feed, failed_at)
) ENGINE=InnoDB;

-- The outbox's partition count (one row). Appends read it with a shared
-- lock, so that SetPartitions, which updates it, waits for the appends in
-- flight and holds new ones back until it commits. binlog_file and
-- binlog_pos are where the binlog stood once the outbox existed (Migrate
-- records them; NULL when it could not read them): a feed with no saved
-- position reads the binlog from there, and scans the outbox instead when
-- they are NULL or that binlog was purged.
CREATE TABLE ferry_settings (
    id          TINYINT        NOT NULL,
    partitions  INT            NOT NULL,
    binlog_file VARBINARY(512) NULL,
    binlog_pos  BIGINT         NULL,
    PRIMARY KEY (id),
    CHECK (partitions BETWEEN 1 AND 4096)
) ENGINE=InnoDB;
INSERT INTO ferry_settings (id, partitions) VALUES (1, GREATEST({partitions}, 1));

-- Events the relay set aside because their key's destination stopped
-- acknowledging them, in each key's order (id).
CREATE TABLE ferry_parked (
    id           BIGINT          NOT NULL AUTO_INCREMENT,
    feed         VARBINARY(255)  NOT NULL,
    k            VARBINARY(1024) NOT NULL,
    event_id     BINARY(16)      NOT NULL,
    topic        VARBINARY(200)  NOT NULL,
    seq          BIGINT          NOT NULL,
    type         VARBINARY(256)  NOT NULL,
    source       VARBINARY(1024) NOT NULL,
    content_type VARBINARY(255)  NOT NULL,
    headers      LONGBLOB        NULL,
    payload      LONGBLOB        NOT NULL,
    created_at   BIGINT          NOT NULL,
    parked_at    BIGINT          NOT NULL,
    held         BOOLEAN         NOT NULL DEFAULT FALSE,
    reason       LONGBLOB        NOT NULL,
    PRIMARY KEY (id),
    KEY ferry_parked_key_idx (feed, k, id),
    UNIQUE KEY ferry_parked_event_idx (feed, event_id)
) ENGINE=InnoDB;
