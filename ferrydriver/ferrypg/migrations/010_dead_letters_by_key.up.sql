-- Ferry schema version 10: a key's dead letters in list order, for the
-- console's key page and `ferry dlq list --key`: a page of them is a range
-- of this index, where the list's index (009) would be walked from the
-- newest failure until the key's rows had been found. Dead letters are
-- written rarely (one per event a sink refused), so the index costs the
-- relay's hot path nothing.
CREATE INDEX dead_letters_key_idx ON {schema}.dead_letters (key, failed_at DESC, event_id);
