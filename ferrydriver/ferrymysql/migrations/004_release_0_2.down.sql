ALTER TABLE ferry_parked DROP COLUMN attempts, DROP COLUMN first_failure;
ALTER TABLE ferry_inbox_groups DROP COLUMN sweeping, DROP COLUMN sweep_after, DROP COLUMN sweep_gen;
