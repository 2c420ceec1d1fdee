DROP TABLE IF EXISTS {schema}.settle_waiters;
DROP TABLE IF EXISTS {schema}.inbox_groups;
DROP TABLE IF EXISTS {schema}.inbox_keys;
DROP TABLE IF EXISTS {schema}.inbox;
