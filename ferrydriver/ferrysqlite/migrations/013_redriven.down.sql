DROP INDEX ferry_parked_redriven_idx;
ALTER TABLE ferry_parked DROP COLUMN redriven;
