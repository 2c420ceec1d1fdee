-- Ferry schema version 3: request records for idempotent requests
-- (ferry.RunTx with a RequestID). The schema name is filled in by ferry.

-- One row per request ID, written in the request's own transaction: the
-- claim first (so that a concurrent duplicate waits on the primary key),
-- the result at the end. A committed row always has its result.
CREATE TABLE {schema}.requests (
    id          text        PRIMARY KEY,
    fingerprint text        NOT NULL,
    result      bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX requests_created_at_idx ON {schema}.requests (created_at);
