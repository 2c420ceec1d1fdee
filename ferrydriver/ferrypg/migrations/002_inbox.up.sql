-- Ferry schema version 2: consumer inboxes. The schema name is filled in by ferry.

-- One row per (consumer group, event). pos is the ingestion order; for one
-- key it is the delivery order, and rows of a key run in pos order.
CREATE TABLE {schema}.inbox (
    group_name       text        NOT NULL,
    event_id         uuid        NOT NULL,
    pos              bigserial   NOT NULL,
    key              text        NOT NULL,
    seq              bigint      NOT NULL DEFAULT 0,
    topic            text        NOT NULL,
    type             text        NOT NULL,
    source           text        NOT NULL DEFAULT '',
    content_type     text        NOT NULL DEFAULT '',
    headers          jsonb,
    payload          bytea       NOT NULL,
    created_at       timestamptz NOT NULL,
    state            text        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'processing', 'processed', 'failed', 'dead', 'discarded', 'retracted')),
    attempts         integer     NOT NULL DEFAULT 0,
    last_error       text,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    claimed_by       text,
    claim_expires_at timestamptz,
    received_at      timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    -- event_id leads: a statement that names only a group (and a key) must
    -- not be able to range over the primary key instead of the indexes
    -- below, whatever the statistics say.
    PRIMARY KEY (event_id, group_name)
);

-- A key's unfinished rows in order: its head is the first. key leads, so
-- that statements that name a row by (group_name, event_id) cannot pick
-- this index over the primary key (with statistics that lag a fast-growing
-- inbox the planner would, and scan every unfinished row of the group).
CREATE INDEX inbox_unfinished_idx ON {schema}.inbox (key, group_name, pos)
    WHERE state IN ('pending', 'processing', 'failed', 'dead');

-- One row per (group, key) that has or had work: when its head may run.
-- runnable_at is NULL when nothing can run: no unfinished row, or held_by
-- names the DEAD row that holds the key's later rows back. For a PROCESSING
-- head it is the claim's expiry, so a crashed worker's row becomes
-- claimable again by itself; for a FAILED head its next attempt. Claiming
-- takes these rows with FOR UPDATE SKIP LOCKED: O(claimed keys), whatever
-- the backlog. Every change of a key's head locks its row here first, so
-- ingestion and completion of one key serialise.
CREATE TABLE {schema}.inbox_keys (
    group_name  text        NOT NULL,
    key         text        NOT NULL,
    runnable_at timestamptz,
    held_by     uuid,
    PRIMARY KEY (group_name, key)
) WITH (fillfactor = 70);

CREATE INDEX inbox_keys_runnable_idx ON {schema}.inbox_keys (group_name, runnable_at)
    WHERE runnable_at IS NOT NULL;

-- Each group's dead policy: true holds a key's later rows behind a DEAD
-- row. Stored so that operators' redrives and discards follow it.
CREATE TABLE {schema}.inbox_groups (
    group_name text    PRIMARY KEY,
    hold_dead  boolean NOT NULL
);

-- Retention of processed rows, oldest first.
CREATE INDEX inbox_processed_idx ON {schema}.inbox (group_name, finished_at) WHERE state = 'processed';
-- Dead letters by time, for listing.
CREATE INDEX inbox_dead_idx ON {schema}.inbox (group_name, finished_at) WHERE state = 'dead';

-- Callers of AwaitSettled that are waiting, and for which events: finishing
-- one of those events sends a NOTIFY (only then: NOTIFY costs a
-- cluster-wide lock at commit). Unlogged: a waiter outlives no restart.
CREATE UNLOGGED TABLE {schema}.settle_waiters (
    id         uuid        PRIMARY KEY,
    group_name text        NOT NULL,
    event_ids  uuid[]      NOT NULL,
    until      timestamptz NOT NULL
);
CREATE INDEX settle_waiters_group_idx ON {schema}.settle_waiters (group_name);
