-- Ferry schema version 2 for MySQL and MariaDB: the consumer side.
-- Consumer inboxes (one row per group and event, one per group and key,
-- each group's dead policy), request records for idempotent RunTx calls,
-- and the activity samples the console charts. Text is bytes and times are
-- microseconds since the epoch from the server's clock, as in version 1.

-- One row per (consumer group, event). pos is the ingestion order: a key's
-- rows are inserted in delivery order, so they run in pos order. state is
-- one of pending, processing, processed, failed, dead, discarded,
-- retracted. claim_token fences every change of a claimed row: an attempt
-- that outlived its claim presents an old token and changes nothing.
-- attempt_log is the row's history (ferrydriver.AttemptLister): its latest
-- 20 failures and redrives as a JSON array, written only by the statements
-- that record one, and removed with the row; utf8mb4 so that the JSON
-- functions read it whatever the database's default character set.
--
-- No index has a partial condition (MySQL has none), so every index holds
-- every row; each list names the state (one range per state) so that a
-- page is a range of one of them, whatever the table holds:
-- - ferry_inbox_event_idx: dedup on (group, event ID), and every lookup of
--   an event (settlement, completion, redrive); an ingester reads which of
--   its events exist and inserts only the others, so that concurrent
--   ingesters of different events never take the gap locks of a duplicate
--   key check (a duplicate found by INSERT locks the gap before it, and
--   another ingester inserting into that gap waits, or deadlocks);
-- - ferry_inbox_head_idx: a key's oldest row in a state, the first entry
--   of a range (a claim finds the key's head as the least of its oldest
--   pending, failed, processing and, under the hold policy, dead rows);
-- - ferry_inbox_pages_idx: a group's rows of one state in the order the
--   console lists them (newest finished, then newest received, first),
--   the counts by state (capped), the rows being processed (rescue), the
--   oldest processed rows (retention) and the newest dead ones (reasons);
-- - ferry_inbox_key_pages_idx: the same order for one key's rows.
CREATE TABLE ferry_inbox (
    pos              BIGINT          NOT NULL AUTO_INCREMENT,
    group_name       VARBINARY(255)  NOT NULL,
    event_id         BINARY(16)      NOT NULL,
    k                VARBINARY(1024) NOT NULL,
    seq              BIGINT          NOT NULL DEFAULT 0,
    topic            VARBINARY(200)  NOT NULL,
    type             VARBINARY(256)  NOT NULL,
    source           VARBINARY(1024) NOT NULL DEFAULT '',
    content_type     VARBINARY(255)  NOT NULL DEFAULT '',
    headers          LONGBLOB        NULL,
    payload          LONGBLOB        NOT NULL,
    created_at       BIGINT          NOT NULL,
    state            VARBINARY(16)   NOT NULL DEFAULT 'pending',
    attempts         INT             NOT NULL DEFAULT 0,
    last_error       LONGBLOB        NULL,
    next_attempt_at  BIGINT          NOT NULL,
    claimed_by       VARBINARY(255)  NULL,
    claim_token      BINARY(16)      NULL,
    claim_expires_at BIGINT          NULL,
    received_at      BIGINT          NOT NULL,
    finished_at      BIGINT          NULL,
    attempt_log      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    PRIMARY KEY (pos),
    UNIQUE KEY ferry_inbox_event_idx (group_name, event_id),
    KEY ferry_inbox_head_idx (group_name, k, state, pos),
    KEY ferry_inbox_pages_idx (group_name, state, finished_at, received_at, event_id),
    KEY ferry_inbox_key_pages_idx (group_name, k, state, finished_at, received_at, event_id),
    CONSTRAINT ferry_inbox_state CHECK (state IN ('pending', 'processing', 'processed', 'failed', 'dead', 'discarded', 'retracted'))
) ENGINE=InnoDB;

-- One row per (group, key) that has or had work: when its head may run.
-- runnable_at NULL: nothing to run (held_by then names the DEAD row that
-- holds the key, under the hold policy). Claims take due keys with
-- SELECT ... FOR UPDATE SKIP LOCKED on ferry_inbox_keys_runnable_idx, so
-- that workers never wait for each other; every other change of a key's
-- rows locks its row here (by primary key: a record lock, never a gap), so
-- that a claim holding it sees the key's rows stand still. A finish in the
-- handler's own transaction (REPEATABLE READ, whose reads may be older
-- than its locks) does not recompute the head: it makes the key due now,
-- and the next claim, at READ COMMITTED, reads the head afresh.
CREATE TABLE ferry_inbox_keys (
    group_name  VARBINARY(255)  NOT NULL,
    k           VARBINARY(1024) NOT NULL,
    runnable_at BIGINT          NULL,
    held_by     BINARY(16)      NULL,
    PRIMARY KEY (group_name, k),
    KEY ferry_inbox_keys_runnable_idx (group_name, runnable_at)
) ENGINE=InnoDB;

-- Each group's dead policy (TRUE: a DEAD row holds its key's later rows).
-- A group with none stored holds.
CREATE TABLE ferry_inbox_groups (
    group_name VARBINARY(255) NOT NULL,
    hold_dead  BOOLEAN        NOT NULL,
    PRIMARY KEY (group_name)
) ENGINE=InnoDB;

-- Request records of idempotent requests (ferry.RunTx with a RequestID):
-- claimed at the start of the request's transaction, finished with its
-- result at the end. A COMMIT whose answer was lost is resolved by this
-- record once the session that sent it has ended: present with the
-- attempt's token, the transaction committed; absent (or another
-- attempt's), it did not.
CREATE TABLE ferry_requests (
    id          VARBINARY(512) NOT NULL,
    fingerprint VARBINARY(255) NOT NULL,
    attempt     BINARY(16)     NOT NULL,
    result      LONGBLOB       NULL,
    created_at  BIGINT         NOT NULL,
    finished_at BIGINT         NULL,
    PRIMARY KEY (id),
    KEY ferry_requests_created_idx (created_at)
) ENGINE=InnoDB;

-- What relays and consumers did over time, for the console: one row per
-- component, process and interval (see ferrydriver.ActivitySample).
-- Durations are seconds. Listed and expired by time (at).
CREATE TABLE ferry_activity (
    kind        VARBINARY(32)  NOT NULL,
    name        VARBINARY(255) NOT NULL,
    process     VARBINARY(255) NOT NULL,
    at          BIGINT         NOT NULL,
    seconds     DOUBLE         NOT NULL,
    done        BIGINT         NOT NULL,
    failed      BIGINT         NOT NULL,
    dead        BIGINT         NOT NULL,
    latency_p50 DOUBLE         NOT NULL,
    latency_p99 DOUBLE         NOT NULL,
    handler_p50 DOUBLE         NOT NULL,
    handler_p99 DOUBLE         NOT NULL,
    lag_events  BIGINT         NOT NULL DEFAULT 0,
    lag_seconds DOUBLE         NOT NULL DEFAULT 0,
    PRIMARY KEY (kind, name, process, at),
    KEY ferry_activity_at_idx (at)
) ENGINE=InnoDB;
