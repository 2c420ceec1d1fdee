ALTER TABLE ferry_parked DROP COLUMN attempts, DROP COLUMN first_failure;
