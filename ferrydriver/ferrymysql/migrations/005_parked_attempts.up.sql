-- Ferry schema version 5 for MySQL: a parked key's head keeps its failed
-- attempts and the time of the first (SetParkedAttempts, in microseconds;
-- 0: none), so that the relay's MaxAttempts and MaxAge count across
-- leaderships instead of starting afresh with each.
ALTER TABLE ferry_parked
    ADD COLUMN attempts      INT    NOT NULL DEFAULT 0,
    ADD COLUMN first_failure BIGINT NOT NULL DEFAULT 0;
