ALTER TABLE {schema}.activity DROP COLUMN lag_events, DROP COLUMN lag_seconds;
