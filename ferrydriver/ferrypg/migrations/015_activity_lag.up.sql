-- Ferry schema version 15: a relay's samples carry its feed's lag (the
-- events its checkpoint has not passed, the age of the oldest unpublished
-- one), for the console's lag charts. Constant defaults: the table is not
-- rewritten.
ALTER TABLE {schema}.activity ADD COLUMN lag_events bigint NOT NULL DEFAULT 0,
                              ADD COLUMN lag_seconds double precision NOT NULL DEFAULT 0;
