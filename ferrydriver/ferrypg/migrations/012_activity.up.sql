-- Ferry schema version 12: what relays and consumers did over time, for
-- the console. Every running relay (of a feed partition) and consumer (of
-- a group) records one row per interval (10 s by default): how many events
-- it published or applied, failed and dead-lettered, and their latencies.
-- The console sums a component's processes per interval. Rows older than
-- the retention (24 h by default) are removed by the recorders themselves.
CREATE TABLE {schema}.activity (
    kind        text             NOT NULL,
    name        text             NOT NULL,
    process     text             NOT NULL,
    at          timestamptz      NOT NULL,
    seconds     double precision NOT NULL,
    done        bigint           NOT NULL,
    failed      bigint           NOT NULL,
    dead        bigint           NOT NULL,
    latency_p50 double precision NOT NULL,
    latency_p99 double precision NOT NULL,
    handler_p50 double precision NOT NULL,
    handler_p99 double precision NOT NULL,
    PRIMARY KEY (kind, name, process, at)
);
-- The console reads the last hour of every component; retention removes
-- the oldest.
CREATE INDEX activity_at_idx ON {schema}.activity (at);
