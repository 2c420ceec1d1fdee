DROP INDEX IF EXISTS {schema}.dead_letters_feed_failed_at_idx;
