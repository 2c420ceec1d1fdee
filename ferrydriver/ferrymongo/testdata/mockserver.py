"""Scripted MongoDB server replies for ferrymongo's error-path tests.

Run by the Go tests with Debian's python3-mockupdb:
    /usr/bin/python3 testdata/mockserver.py <scenario>
It prints the server's URI on its first line, then serves the scenario
until stdin closes.
"""
import sys
import threading

from mockupdb import MockupDB, OpMsg

scenario = sys.argv[1]

hello = {"ismaster": True, "isWritablePrimary": True, "minWireVersion": 0, "maxWireVersion": 21,
         "maxBsonObjectSize": 16777216, "maxMessageSizeBytes": 48000000, "maxWriteBatchSize": 100000,
         "logicalSessionTimeoutMinutes": 30}
if scenario == "standalone":
    pass  # no setName, no msg: a standalone mongod
elif scenario == "mongos":
    hello["msg"] = "isdbgrid"
else:
    sys.exit("unknown scenario " + scenario)

server = MockupDB(auto_ismaster=hello)
server.autoresponds("hello", **hello)
server.autoresponds("ping", ok=1)
server.autoresponds("endSessions", ok=1)
port = server.run()
print(server.uri, flush=True)
sys.stdin.read()  # serve until the test closes our stdin
server.stop()
