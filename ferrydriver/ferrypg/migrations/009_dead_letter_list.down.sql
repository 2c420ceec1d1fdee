CREATE INDEX dead_letters_failed_at_idx ON {schema}.dead_letters (failed_at);
DROP INDEX {schema}.dead_letters_list_idx;
