DROP INDEX {schema}.parked_redriven_idx;
ALTER TABLE {schema}.parked DROP COLUMN redriven;
