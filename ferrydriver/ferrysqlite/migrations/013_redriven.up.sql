-- Ferry schema version 13 for SQLite: a redriven relay dead letter goes
-- back to the feed that dead-lettered it, and to no other (it was appended
-- to the outbox again, and every feed of its partition published it
-- again): it joins its key's parked queue in that feed, marked, and that
-- feed's relay looks every heartbeat for keys with such events, through
-- this index, whatever the length of the other keys' queues.
ALTER TABLE ferry_parked ADD COLUMN redriven INTEGER NOT NULL DEFAULT 0;
CREATE INDEX ferry_parked_redriven_idx ON ferry_parked (feed, key) WHERE redriven = 1;
