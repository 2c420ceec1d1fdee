-- Ferry schema version 14 for SQLite: the schema changes of release 0.2,
-- one migration per release (those of 0.1 are 001 to 013). A parked key's
-- head keeps its failed attempts and the time of the first
-- (SetParkedAttempts, in microseconds; 0: none), so that the relay's
-- MaxAttempts and MaxAge count across leaderships instead of starting
-- afresh with each.
ALTER TABLE ferry_parked ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ferry_parked ADD COLUMN first_failure INTEGER NOT NULL DEFAULT 0;
