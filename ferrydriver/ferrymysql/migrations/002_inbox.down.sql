DROP TABLE ferry_activity;
DROP TABLE ferry_requests;
DROP TABLE ferry_inbox_groups;
DROP TABLE ferry_inbox_keys;
DROP TABLE ferry_inbox;
