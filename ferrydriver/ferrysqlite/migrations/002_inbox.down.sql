DROP TABLE ferry_inbox_groups;
DROP TABLE ferry_inbox_keys;
DROP TABLE ferry_inbox;
