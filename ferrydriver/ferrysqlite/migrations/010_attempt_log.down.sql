ALTER TABLE ferry_inbox DROP COLUMN attempt_log;
