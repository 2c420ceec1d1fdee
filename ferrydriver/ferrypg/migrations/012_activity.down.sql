DROP TABLE {schema}.activity;
