-- Ferry schema version 9: what relays and consumers did over time, for
-- the console: one row per component, process and interval (see
-- ferrydriver.ActivitySample). Times are microseconds since the epoch,
-- durations seconds.
CREATE TABLE ferry_activity (
    kind        TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    process     TEXT    NOT NULL,
    at          INTEGER NOT NULL,
    seconds     REAL    NOT NULL,
    done        INTEGER NOT NULL,
    failed      INTEGER NOT NULL,
    dead        INTEGER NOT NULL,
    latency_p50 REAL    NOT NULL,
    latency_p99 REAL    NOT NULL,
    handler_p50 REAL    NOT NULL,
    handler_p99 REAL    NOT NULL,
    PRIMARY KEY (kind, name, process, at)
);
CREATE INDEX ferry_activity_at_idx ON ferry_activity (at);
