-- Ferry schema version 11: a relay's samples carry its feed's lag (the
-- events its checkpoint has not passed, the age of the oldest unpublished
-- one, in seconds), for the console's lag charts.
ALTER TABLE ferry_activity ADD COLUMN lag_events INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ferry_activity ADD COLUMN lag_seconds REAL NOT NULL DEFAULT 0;
