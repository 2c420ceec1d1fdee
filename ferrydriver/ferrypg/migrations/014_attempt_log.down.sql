ALTER TABLE {schema}.inbox DROP COLUMN attempt_log;
