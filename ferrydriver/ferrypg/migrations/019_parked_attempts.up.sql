-- Ferry schema version 19: a parked key's head keeps its failed attempts
-- and the time of the first (SetParkedAttempts), so that the relay's
-- MaxAttempts and MaxAge count across leaderships instead of starting
-- afresh with each: a relay rebalanced more often than MaxAge gave up on
-- nothing.
ALTER TABLE {schema}.parked
    ADD COLUMN attempts      integer NOT NULL DEFAULT 0,
    ADD COLUMN first_failure timestamptz;
