DROP TABLE IF EXISTS {schema}.dead_letters;
DROP TABLE IF EXISTS {schema}.leases;
DROP TABLE IF EXISTS {schema}.checkpoints;
DROP TABLE IF EXISTS {schema}.listeners;
DROP TABLE IF EXISTS {schema}.keys;
DROP TABLE IF EXISTS {schema}.outbox;
