DROP TABLE {schema}.requests;
