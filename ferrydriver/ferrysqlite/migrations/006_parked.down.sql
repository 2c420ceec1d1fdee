DROP TABLE ferry_parked;
