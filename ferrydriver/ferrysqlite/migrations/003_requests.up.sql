-- Ferry schema version 3 for SQLite: request records for idempotent
-- requests (ferry.RunTx with a RequestID), claimed at the start of the
-- request's transaction and finished with its result at the end.
CREATE TABLE ferry_requests (
    id          TEXT    PRIMARY KEY,
    fingerprint TEXT    NOT NULL,
    result      BLOB,
    created_at  INTEGER NOT NULL,
    finished_at INTEGER
) WITHOUT ROWID;
CREATE INDEX ferry_requests_created_at_idx ON ferry_requests (created_at);
