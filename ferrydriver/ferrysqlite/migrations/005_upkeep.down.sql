ALTER TABLE ferry_keys DROP COLUMN touched_at;
ALTER TABLE ferry_keys DROP COLUMN last_id;
DROP INDEX IF EXISTS ferry_dead_letters_feed_failed_at_idx;
