DROP INDEX {schema}.dead_letters_key_idx;
