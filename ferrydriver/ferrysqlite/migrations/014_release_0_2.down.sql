ALTER TABLE ferry_parked DROP COLUMN first_failure;
ALTER TABLE ferry_parked DROP COLUMN attempts;
