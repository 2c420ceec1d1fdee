-- Ferry schema version 10: each inbox row's history (ferrydriver.
-- AttemptLister): its failed attempts with their errors, and its redrives,
-- the latest 20, as a JSON array on the row itself, so that it goes with
-- the row (retention, discard) and costs only the statements that record a
-- failure or a redrive. NULL until the row first fails.
ALTER TABLE ferry_inbox ADD COLUMN attempt_log TEXT;
