DROP TABLE {schema}.feed_seqs;
ALTER TABLE {schema}.parked DROP COLUMN attempts, DROP COLUMN first_failure;
ALTER TABLE {schema}.inbox_groups DROP COLUMN sweeping, DROP COLUMN sweep_after, DROP COLUMN sweep_gen;
