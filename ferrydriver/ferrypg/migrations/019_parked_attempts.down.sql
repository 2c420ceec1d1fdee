ALTER TABLE {schema}.parked DROP COLUMN attempts, DROP COLUMN first_failure;
