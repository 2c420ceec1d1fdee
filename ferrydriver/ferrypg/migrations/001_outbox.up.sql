-- Ferry schema version 1: outbox, per-key sequences, relay checkpoints,
-- leases and relay dead letters. The schema name is filled in by ferry.
CREATE SCHEMA IF NOT EXISTS {schema};

-- One row per emitted event. id comes from a sequence with CACHE 1 (the
-- default; never raise it): the feed relies on ids being drawn in time order.
-- xid is the writing transaction's id; the producing statement assigns it
-- before drawing id (see ferrypg's feed documentation).
CREATE TABLE {schema}.outbox (
    id           bigserial   NOT NULL,
    partition    integer     NOT NULL DEFAULT 0,
    xid          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    event_id     uuid        NOT NULL,
    topic        text        NOT NULL,
    key          text        NOT NULL,
    seq          bigint      NOT NULL,
    type         text        NOT NULL,
    source       text        NOT NULL DEFAULT '',
    content_type text        NOT NULL DEFAULT '',
    headers      jsonb,
    payload      bytea       NOT NULL,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (partition, id)
);

-- Late-committing transactions ("stragglers") are fetched by their xid, in
-- id order; partition is included so that the feed can filter on it inside
-- the index. The feed's queries write "partition + 0" where they must use
-- this index, so that the planner cannot pick a range of the primary key
-- instead (with statistics that lag a bulk load it would, and read the
-- whole history):
--   SELECT ... WHERE xid = $x AND partition + 0 = $p AND id > $a AND id <= $b ORDER BY id LIMIT $n
--   Limit -> Index Scan using outbox_xid_idx on outbox
--              Index Cond: ((xid = '1234'::xid8) AND (id > 0) AND (id <= 1000000))
--              Filter: ((partition + 0) = 0)
CREATE INDEX outbox_xid_idx ON {schema}.outbox (xid, id) INCLUDE (partition);

-- Per-key sequence. Appending an event upserts its key's row, which takes a
-- row lock held to commit: same-key producers serialise, other keys never
-- contend, and within a key id order equals commit order.
CREATE TABLE {schema}.keys (
    key text   PRIMARY KEY,
    seq bigint NOT NULL
) WITH (fillfactor = 80);

-- Relays that are idle and waiting for a wake-up. Producers send NOTIFY
-- only while a row here has not expired: NOTIFY takes a cluster-wide lock at
-- commit, which costs busy producers about a third of their throughput,
-- and a busy relay does not need wake-ups.
CREATE TABLE {schema}.listeners (
    partition integer     PRIMARY KEY,
    until     timestamptz NOT NULL
);

CREATE TABLE {schema}.checkpoints (
    feed       text        PRIMARY KEY,
    partition  integer     NOT NULL DEFAULT 0,
    cursor     bytea,
    term       bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.leases (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    term       bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE TABLE {schema}.dead_letters (
    feed         text        NOT NULL,
    event_id     uuid        NOT NULL,
    topic        text        NOT NULL,
    key          text        NOT NULL,
    seq          bigint      NOT NULL,
    type         text        NOT NULL,
    source       text        NOT NULL,
    content_type text        NOT NULL,
    headers      jsonb,
    payload      bytea       NOT NULL,
    created_at   timestamptz NOT NULL,
    reason       text        NOT NULL,
    failed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (feed, event_id)
);
CREATE INDEX dead_letters_failed_at_idx ON {schema}.dead_letters (failed_at);
