DROP TABLE ferry_requests;
