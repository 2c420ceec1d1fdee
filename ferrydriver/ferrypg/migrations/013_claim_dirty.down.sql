ALTER TABLE {schema}.inbox_keys DROP COLUMN claim_dirty;
