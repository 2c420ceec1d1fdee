DROP TABLE ferry_settings;
