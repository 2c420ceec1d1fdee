-- Ferry schema version 6: parked events. When a key's destination stops
-- acknowledging it while other keys flow, the relay moves the key's events
-- here (fenced by its lease) so that its checkpoint can pass them, and
-- publishes them from here, in id order per key, once the key recovers.
CREATE TABLE {schema}.parked (
    feed         text        NOT NULL,
    key          text        NOT NULL,
    id           bigserial   NOT NULL,
    event_id     uuid        NOT NULL,
    topic        text        NOT NULL,
    seq          bigint      NOT NULL,
    type         text        NOT NULL,
    source       text        NOT NULL,
    content_type text        NOT NULL,
    headers      jsonb,
    payload      bytea       NOT NULL,
    created_at   timestamptz NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    held         boolean     NOT NULL DEFAULT false,
    reason       text        NOT NULL DEFAULT '',
    -- A key's head is the first row by id: (feed, key, id) serves it.
    PRIMARY KEY (feed, key, id)
);
-- An event is parked once per feed (a redelivered read of a parked key
-- parks nothing twice), and is removed by its ID.
CREATE UNIQUE INDEX parked_event_idx ON {schema}.parked (feed, event_id);
