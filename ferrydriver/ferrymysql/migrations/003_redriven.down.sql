ALTER TABLE ferry_parked DROP KEY ferry_parked_redriven_idx, DROP COLUMN redriven;
