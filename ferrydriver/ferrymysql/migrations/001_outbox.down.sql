DROP TABLE ferry_parked;
DROP TABLE ferry_settings;
DROP TABLE ferry_dead_letters;
DROP TABLE ferry_leases;
DROP TABLE ferry_checkpoints;
DROP TABLE ferry_keys;
DROP TABLE ferry_outbox;
