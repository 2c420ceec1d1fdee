DROP TABLE ferry_activity;
