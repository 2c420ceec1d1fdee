-- Ferry schema version 11: claims by key. A consumer claims a run of a
-- key's rows (its next rows in order) on the key's row, with one token, one
-- expiry and the range of positions it covers, instead of marking each
-- inbox row PROCESSING: an event then costs one write of its inbox row (its
-- outcome), and a run of a key's events two writes of the key's row in all
-- (the claim and the finish). PROCESSING is no longer stored: a PENDING or
-- FAILED row inside a live claim's range reads as PROCESSING.
--
-- done_pos: every row of the key at or below it has finished (a lower
--   bound: rows above it may have finished too). The next rows to run are
--   the first unfinished ones above it.
-- tail_pos: the highest position ingested for the key. Ingestion raises it
--   under the key's row lock, so a finish that locks the key reads whether
--   more rows came, whatever its snapshot saw.
-- claim_*: the claim of the rows above claim_from (done_pos when claimed)
--   up to claim_through.
-- suspect_through: after a claim expired (its process crashed, or its
--   handler outlived it), the rows it covered run one at a time, each
--   alone, through rescues, up to this position: an event that crashes its
--   process costs no other event an attempt.
-- rescue_at: when a rescue may take the key (an expired claim, or a run of
--   suspect rows); NULL otherwise. runnable_at stays what it was: when an
--   ordinary claim may take the key, NULL while it is claimed.
ALTER TABLE {schema}.inbox_keys
    ADD COLUMN done_pos         bigint NOT NULL DEFAULT 0,
    ADD COLUMN tail_pos         bigint NOT NULL DEFAULT 0,
    ADD COLUMN claim_token      uuid,
    ADD COLUMN claimed_by       text,
    ADD COLUMN claim_from       bigint,
    ADD COLUMN claim_through    bigint,
    ADD COLUMN claim_expires_at timestamptz,
    ADD COLUMN suspect_through  bigint NOT NULL DEFAULT 0,
    ADD COLUMN rescue_at        timestamptz;

-- Keys due for a rescue: expired claims (a claim sets rescue_at to its
-- expiry, a finish clears it) and suspect runs.
CREATE INDEX inbox_keys_rescue_idx ON {schema}.inbox_keys (group_name, rescue_at) WHERE rescue_at IS NOT NULL;

-- A finish sent with its transaction's COMMIT, in one round trip, calls
-- this with the keys whose claims held and the keys it finished: when a
-- claim was lost, the error makes the COMMIT roll back, as the finish's
-- caller would have (ferrypg reads which claims were lost after).
CREATE FUNCTION {schema}.inbox_claims_held(held bigint, finished bigint) RETURNS bigint
    LANGUAGE plpgsql AS $$
BEGIN
    IF held < finished THEN
        RAISE EXCEPTION USING ERRCODE = 'YF001',
            MESSAGE = format('ferry: the inbox claims of %s of %s keys were lost (they expired, or a later attempt took them over): the transaction rolls back', finished - held, finished);
    END IF;
    RETURN held;
END $$;

-- Rows claimed under schema 10 run again (their attempt was counted when
-- they were claimed).
WITH s AS (
    SELECT group_name, key, max(pos) AS tail,
           min(pos) FILTER (WHERE state IN ('pending', 'processing', 'failed', 'dead')) AS head,
           bool_or(state = 'processing') AS busy
      FROM {schema}.inbox GROUP BY group_name, key
)
UPDATE {schema}.inbox_keys k
   SET tail_pos = s.tail, done_pos = COALESCE(s.head - 1, s.tail),
       runnable_at = CASE WHEN s.busy THEN now() ELSE k.runnable_at END
  FROM s WHERE k.group_name = s.group_name AND k.key = s.key;
UPDATE {schema}.inbox SET state = 'pending', claimed_by = NULL, claim_expires_at = NULL, claim_token = NULL
 WHERE state = 'processing';

DROP INDEX {schema}.inbox_processing_key_idx;
ALTER TABLE {schema}.inbox DROP COLUMN claimed_by, DROP COLUMN claim_expires_at, DROP COLUMN claim_token;
