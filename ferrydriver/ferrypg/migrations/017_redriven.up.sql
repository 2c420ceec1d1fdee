-- Ferry schema version 17: a redriven relay dead letter goes back to the
-- feed that dead-lettered it, and to no other (it was appended to the
-- outbox again, and every feed of its partition published it again): it
-- joins its key's parked queue in that feed, marked, and that feed's relay
-- looks every heartbeat for keys with such events, through this index,
-- whatever the length of the other keys' queues.
ALTER TABLE {schema}.parked ADD COLUMN redriven boolean NOT NULL DEFAULT false;
CREATE INDEX parked_redriven_idx ON {schema}.parked (feed, key) WHERE redriven;
