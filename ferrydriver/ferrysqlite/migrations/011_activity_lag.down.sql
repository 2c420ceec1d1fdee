ALTER TABLE ferry_activity DROP COLUMN lag_seconds;
ALTER TABLE ferry_activity DROP COLUMN lag_events;
