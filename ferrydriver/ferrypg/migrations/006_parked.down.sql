DROP TABLE {schema}.parked;
