-- Ferry schema version 3 for MySQL: a redriven relay dead letter goes
-- back to the feed that dead-lettered it, and to no other: it joins its
-- key's parked queue in that feed, marked, and that feed's relay looks
-- every heartbeat for keys with such events, through this index, whatever
-- the length of the other keys' queues.
ALTER TABLE ferry_parked
    ADD COLUMN redriven BOOLEAN NOT NULL DEFAULT FALSE,
    ADD KEY ferry_parked_redriven_idx (feed, redriven, k);
