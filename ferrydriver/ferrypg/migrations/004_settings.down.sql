DROP TABLE {schema}.settings;
