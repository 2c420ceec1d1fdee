ALTER TABLE {schema}.keys DROP COLUMN IF EXISTS xid, DROP COLUMN IF EXISTS touched_at;
DROP INDEX IF EXISTS {schema}.dead_letters_feed_failed_at_idx;
