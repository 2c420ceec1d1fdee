CREATE TABLE {schema}.listeners (
    partition integer     PRIMARY KEY,
    until     timestamptz NOT NULL
);
ALTER TABLE {schema}.settings DROP COLUMN listening;
-- Producers of 0.1 number events again from the keys' highest numbers; a
-- 0.1 relay delivers what 0.2 producers left unnumbered with Seq 0, so
-- let the relays deliver everything before going down.
CREATE TABLE {schema}.keys (
    key        text        PRIMARY KEY,
    seq        bigint      NOT NULL,
    xid        xid8        NOT NULL DEFAULT '0'::xid8,
    touched_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 80);
INSERT INTO {schema}.keys (key, seq, touched_at)
SELECT key, max(seq), max(touched_at) FROM {schema}.feed_seqs GROUP BY key;
DROP TABLE {schema}.feed_seqs;
ALTER TABLE {schema}.parked DROP COLUMN attempts, DROP COLUMN first_failure;
ALTER TABLE {schema}.inbox_groups DROP COLUMN sweeping, DROP COLUMN sweep_after, DROP COLUMN sweep_gen;
