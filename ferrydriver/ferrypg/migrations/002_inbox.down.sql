DROP TABLE IF EXISTS {schema}.inbox_keys;
DROP TABLE IF EXISTS {schema}.inbox;
