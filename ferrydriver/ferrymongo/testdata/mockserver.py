"""Scripted MongoDB server replies for ferrymongo's error-path tests.

Run by the Go tests with Debian's python3-mockupdb:
    /usr/bin/python3 testdata/mockserver.py <scenario>
It prints the server's URI on its first line, then serves the scenario
until stdin closes.
"""
import datetime
import json
import sys

from bson import Binary, Int64, ObjectId, Timestamp
from mockupdb import MockupDB, OpMsg

scenario = sys.argv[1]

hello = {"ismaster": True, "isWritablePrimary": True, "minWireVersion": 0, "maxWireVersion": 21,
         "maxBsonObjectSize": 16777216, "maxMessageSizeBytes": 48000000, "maxWriteBatchSize": 100000,
         "logicalSessionTimeoutMinutes": 30}
if scenario == "standalone":
    pass  # no setName, no msg: a standalone mongod
elif scenario == "mongos":
    hello["msg"] = "isdbgrid"
elif scenario in ("historylost", "quiet", "oplog", "commitunknown", "badtoken", "ttl", "capture", "lag", "dlretention", "prunekeys", "redrive", "feeds",
                  "partitionguard", "migratepartitions", "setpartitions", "policysweep", "reaper"):
    hello.update(setName="rs0", hosts=["localhost"], secondary=False)
else:
    sys.exit("unknown scenario " + scenario)

CLUSTER_TIME = Timestamp(1700000000, 7)

server = MockupDB(auto_ismaster=hello)
server.autoresponds("hello", **hello)
server.autoresponds("ping", ok=1, operationTime=CLUSTER_TIME)
server.autoresponds("endSessions", ok=1)
# killCursors names its collection, so match by command name.
server.autoresponds(lambda r: r.command_name == "killCursors" and r.ok(cursorsKilled=r.doc.get("cursors", []), cursorsNotFound=[],
                                                                       cursorsAlive=[], cursorsUnknown=[]))
# The outbox's creation time, which feeds with no position start from, and
# the stored partition count (state["n"]; None: not migrated yet).
state = {"n": {"partitionguard": 4, "migratepartitions": None, "setpartitions": 4}.get(scenario, 1)}
META = {"quiet": [{"_id": "outbox", "created": Timestamp(1690000000, 3)}]}.get(scenario, [])


def meta_find(r):
    if r.command_name != "find" or r.doc.get("find") != "ferry_meta":
        return False
    want = (r.doc.get("filter") or {}).get("_id")
    docs = [d for d in META if want in (None, d["_id"])]
    if want == "partitions" and state["n"] is not None:
        docs = [{"_id": "partitions", "n": state["n"]}]
    return r.ok(cursor={"id": Int64(0), "ns": "app.ferry_meta", "firstBatch": docs})


server.autoresponds(meta_find)
port = server.run()
print(server.uri, flush=True)


def report(kind, doc):
    """Tell the Go test what the driver sent (one JSON line on stdout)."""
    print(json.dumps({"kind": kind, "doc": json.loads(json.dumps(doc, default=str))}), flush=True)


if scenario == "historylost":
    ns = "app.ferry_outbox"
    # 1. The feed opens its change stream: an empty first batch.
    r = server.receives(OpMsg("aggregate", "ferry_outbox"), timeout=30)
    report("aggregate", r.doc.get("pipeline", [{}])[0].get("$changeStream", {}))
    r.ok(cursor={"id": Int64(42), "ns": ns, "firstBatch": [], "postBatchResumeToken": {"_data": "00AA"}})
    # 2. Its getMore finds the oplog rolled over the position.
    r = server.receives(OpMsg("getMore", Int64(42)), timeout=30)
    r.reply({"ok": 0, "code": 286, "codeName": "ChangeStreamHistoryLost",
             "errmsg": "Resume of change stream was not possible, as the resume point may no longer be in the oplog."})
    # 3. The feed scans the outbox instead: key a seq 1..2, key b seq 1.
    r = server.receives(OpMsg("find", "ferry_outbox"), timeout=30)
    report("find", {"filter": r.doc.get("filter"), "sort": r.doc.get("sort"), "readConcern": r.doc.get("readConcern")})
    created = datetime.datetime(2026, 1, 2, 3, 4, 5)
    docs = [
        {"_id": "01a22951-45fe-71e0-943a-d0986a3e5969", "p": 0, "topic": "orders", "key": "a", "seq": 1, "type": "T", "payload": Binary(b"a1"), "created_at": created},
        {"_id": "01a22951-45fe-71e4-abce-046e2930f327", "p": 0, "topic": "orders", "key": "a", "seq": 2, "type": "T", "payload": Binary(b"a2"), "created_at": created},
        {"_id": "01a22951-45fe-71e6-a92f-abd12b8844ee", "p": 0, "topic": "orders", "key": "b", "seq": 1, "type": "T", "payload": Binary(b"b1"), "created_at": created},
    ]
    r.ok(cursor={"id": Int64(0), "ns": ns, "firstBatch": docs})
    # 4. Back to a stream, from the cluster time taken before the scan.
    r = server.receives(OpMsg("aggregate", "ferry_outbox"), timeout=30)
    report("aggregate", r.doc.get("pipeline", [{}])[0].get("$changeStream", {}))
    r.ok(cursor={"id": Int64(0), "ns": ns, "firstBatch": [], "postBatchResumeToken": {"_data": "00BB"}})

if scenario == "oplog":
    # The oplog reaches back 20 hours.
    for ts in (Timestamp(1700000000, 1), Timestamp(1700000000 + 20 * 3600, 1)):
        r = server.receives(OpMsg("find", "oplog.rs"), timeout=30)
        report("find", {"sort": r.doc.get("sort")})
        r.ok(cursor={"id": Int64(0), "ns": "local.oplog.rs", "firstBatch": [{"ts": ts}]})

if scenario == "badtoken":
    ns = "app.ferry_outbox"
    # Opening the stream after the saved token fails at once: the token is
    # not valid any more. The feed scans the outbox, then streams again.
    r = server.receives(OpMsg("aggregate", "ferry_outbox"), timeout=30)
    report("aggregate", r.doc.get("pipeline", [{}])[0].get("$changeStream", {}))
    r.reply({"ok": 0, "code": 260, "codeName": "InvalidResumeToken", "errmsg": "resume token was not found"})
    r = server.receives(OpMsg("find", "ferry_outbox"), timeout=30)
    report("find", {"filter": r.doc.get("filter")})
    created = datetime.datetime(2026, 1, 2, 3, 4, 5)
    r.ok(cursor={"id": Int64(0), "ns": ns, "firstBatch": [
        {"_id": "01a22951-45fe-71e0-943a-d0986a3e5969", "p": 0, "topic": "orders", "key": "a", "seq": 7, "type": "T",
         "payload": Binary(b"x"), "created_at": created, "appended_at": created}]})
    r = server.receives(OpMsg("aggregate", "ferry_outbox"), timeout=30)
    report("aggregate", r.doc.get("pipeline", [{}])[0].get("$changeStream", {}))
    r.ok(cursor={"id": Int64(0), "ns": ns, "firstBatch": [], "postBatchResumeToken": {"_data": "00CC"}})

if scenario == "commitunknown":
    # The callback's one write, then three commits: the first two answer
    # UnknownTransactionCommitResult (the driver retries a commit once by
    # itself), the third succeeds. The write must not come again.
    r = server.receives(OpMsg("insert", "things"), timeout=30)
    report("insert", {"startTransaction": r.doc.get("startTransaction")})
    r.ok(n=1)
    for i in range(3):
        r = server.receives(OpMsg("commitTransaction"), timeout=30)
        report("commit", {"writeConcern": r.doc.get("writeConcern")})
        if i < 2:
            r.reply({"ok": 0, "code": 91, "codeName": "ShutdownInProgress", "errmsg": "shutting down",
                     "errorLabels": ["UnknownTransactionCommitResult", "RetryableWriteError"]})
        else:
            r.ok()
    # Anything else the driver sends that is not autoresponded would show
    # up here: report it.
    try:
        r = server.receives(timeout=3)
        report("unexpected", {"command": r.command_name})
        r.ok()
    except AssertionError:
        pass

if scenario == "quiet":
    ns = "app.ferry_outbox"
    # A quiet outbox: every batch is empty, but the postBatchResumeToken
    # moves on with the oplog; the feed must report it as its position.
    r = server.receives(OpMsg("aggregate", "ferry_outbox"), timeout=30)
    report("aggregate", r.doc.get("pipeline", [{}])[0].get("$changeStream", {}))
    r.ok(cursor={"id": Int64(42), "ns": ns, "firstBatch": [], "postBatchResumeToken": {"_data": "00AA"}})
    server.autoresponds(lambda r: r.command_name == "getMore" and r.ok(
        cursor={"id": Int64(42), "ns": ns, "nextBatch": [], "postBatchResumeToken": {"_data": "00BB"}}))
    # A second feed opened from the saved position starts after it.
    r = server.receives(OpMsg("aggregate", "ferry_outbox"), timeout=30)
    report("aggregate", r.doc.get("pipeline", [{}])[0].get("$changeStream", {}))
    r.ok(cursor={"id": Int64(0), "ns": ns, "firstBatch": [], "postBatchResumeToken": {"_data": "00BB"}})



def empty_database():
    """Answer Migrate's commands as an empty database would (but the TTL
    index's listIndexes, the partition count's update and the validator's
    collMod, which scenarios answer themselves)."""
    server.autoresponds(lambda r: r.command_name == "listCollections" and r.ok(
        cursor={"id": Int64(0), "ns": "app.$cmd.listCollections", "firstBatch": []}))
    server.autoresponds(lambda r: r.command_name == "create" and r.ok())
    server.autoresponds(lambda r: r.command_name == "update" and r.ok(n=1, nModified=0))
    server.autoresponds(lambda r: r.command_name == "createIndexes" and r.ok(
        createdCollectionAutomatically=False, numIndexesBefore=1, numIndexesAfter=2))
    # The inbox's replaced index: not there.
    server.autoresponds(lambda r: r.command_name == "dropIndexes" and r.doc.get("dropIndexes") == "ferry_inbox" and r.fail(
        "index not found with name [g_1_state_1_finished_at_1]", code=27))
    for coll in ("ferry_checkpoints", "ferry_outbox"):
        server.autoresponds(lambda r, coll=coll: r.command_name == "find" and r.doc.get("find") == coll and r.ok(
            cursor={"id": Int64(0), "ns": "app." + coll, "firstBatch": []}))


def validator_set(r):
    """Report a collMod that sets the outbox's validator."""
    if r.command_name != "collMod" or "validator" not in r.doc:
        return False
    report("validator", {"collMod": r.doc["collMod"], "validator": r.doc["validator"]})
    return r.ok()


if scenario == "ttl":
    # Three Migrates: RetentionTTL 2h over an outbox whose TTL index says
    # 1h (collMod), then 0 (drop), then 1h with no index (create). The
    # rest of Migrate is answered as an empty database would.
    empty_database()
    server.autoresponds(lambda r: r.command_name == "collMod" and "validator" in r.doc and r.ok())

    def indexes_created(r):
        if r.command_name != "createIndexes":
            return False
        # Only the outbox's TTL index: the activity samples' own TTL index
        # (a fixed day) is created on every Migrate too.
        for ix in r.doc.get("indexes", []):
            if "expireAfterSeconds" in ix and r.doc.get("createIndexes") == "ferry_outbox":
                report("createIndexes", ix)
        return r.ok(createdCollectionAutomatically=False, numIndexesBefore=1, numIndexesAfter=2)
    server.autoresponds(indexes_created)
    ttl_index = {"v": 2, "key": {"appended_at": 1}, "name": "ferry_retention_ttl", "expireAfterSeconds": 3600}
    plain = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
    for listing, then in (([plain, ttl_index], "collMod"), ([plain, ttl_index], "dropIndexes"), ([plain], None)):
        r = server.receives(OpMsg("listIndexes", "ferry_outbox"), timeout=30)
        r.ok(cursor={"id": Int64(0), "ns": "app.ferry_outbox", "firstBatch": listing})
        if then:
            r = server.receives(OpMsg(then, "ferry_outbox"), timeout=30)
            report(then, {k: v for k, v in r.doc.items() if k in ("index", "collMod", "dropIndexes")})
            r.ok(nIndexesWas=2)

if scenario == "capture":
    # A database-level stream (aggregate: 1) over business collections.
    r = server.receives(OpMsg("aggregate", 1), timeout=30)
    report("aggregate", {"changeStream": r.doc["pipeline"][0]["$changeStream"], "match": r.doc["pipeline"][1]["$match"]})
    wall = datetime.datetime(2026, 3, 4, 5, 6, 7)
    r.ok(cursor={"id": Int64(42), "ns": "app.$cmd.aggregate", "postBatchResumeToken": {"_data": "82AA02"}, "firstBatch": [
        {"_id": {"_data": "82AA01"}, "operationType": "update", "clusterTime": Timestamp(1700000100, 1), "wallTime": wall,
         "ns": {"db": "app", "coll": "customers"}, "documentKey": {"_id": "c-1"},
         "updateDescription": {"updatedFields": {"tier": "gold"}, "removedFields": [], "truncatedArrays": []},
         "fullDocument": {"_id": "c-1", "tier": "gold"}, "fullDocumentBeforeChange": {"_id": "c-1", "tier": "silver"}},
        {"_id": {"_data": "82AA02"}, "operationType": "insert", "clusterTime": Timestamp(1700000100, 2), "wallTime": wall,
         "ns": {"db": "app", "coll": "orders"}, "documentKey": {"_id": ObjectId("64b7f0c2a1b2c3d4e5f60718")},
         "fullDocument": {"_id": ObjectId("64b7f0c2a1b2c3d4e5f60718"), "total": 12}},
    ]})
    # The oplog rolls over the position: without the opt-in the feed stops.
    r = server.receives(OpMsg("getMore", Int64(42)), timeout=30)
    r.reply({"ok": 0, "code": 286, "codeName": "ChangeStreamHistoryLost", "errmsg": "Resume of change stream was not possible"})
    # With ResumeFromNowOnHistoryLost, a feed opened after the token
    # meets the same loss, then opens at the present cluster time.
    r = server.receives(OpMsg("aggregate", 1), timeout=30)
    report("aggregate", {"changeStream": r.doc["pipeline"][0]["$changeStream"]})
    r.reply({"ok": 0, "code": 286, "codeName": "ChangeStreamHistoryLost", "errmsg": "Resume of change stream was not possible"})
    r = server.receives(OpMsg("aggregate", 1), timeout=30)
    report("aggregate", {"changeStream": r.doc["pipeline"][0]["$changeStream"]})
    r.ok(cursor={"id": Int64(0), "ns": "app.$cmd.aggregate", "firstBatch": [], "postBatchResumeToken": {"_data": "82BB00"}})

if scenario == "lag":
    # FeedLag: the checkpoint, the lease (none), then the counted sample
    # of the first 1000 events after the checkpoint (appended over 10 s)
    # and the partition's newest event (30 s after the first).
    first = datetime.datetime(2026, 5, 1, 12, 0, 0)
    r = server.receives(OpMsg("find", "ferry_checkpoints"), timeout=30)
    r.ok(cursor={"id": Int64(0), "ns": "app.ferry_checkpoints", "firstBatch": [
        {"_id": "default/0", "p": 0, "cursor": Binary(b'{"at":"2026-05-01T11:59:59Z"}'), "term": Int64(3), "updated_at": first}]})
    r = server.receives(OpMsg("aggregate", "ferry_leases"), timeout=30)
    r.ok(cursor={"id": Int64(0), "ns": "app.ferry_leases", "firstBatch": []})
    r = server.receives(OpMsg("aggregate", "ferry_outbox"), timeout=30)
    report("aggregate", {"pipeline": r.doc.get("pipeline")})
    r.ok(cursor={"id": Int64(0), "ns": "app.ferry_outbox", "firstBatch": [
        {"_id": None, "n": 1000, "first": first, "last": first + datetime.timedelta(seconds=10),
         "oldest": first - datetime.timedelta(minutes=1)}]})
    r = server.receives(OpMsg("find", "ferry_outbox"), timeout=30)
    report("find", {"filter": r.doc.get("filter"), "sort": r.doc.get("sort")})
    r.ok(cursor={"id": Int64(0), "ns": "app.ferry_outbox", "firstBatch": [{"appended_at": first + datetime.timedelta(seconds=30)}]})

if scenario == "dlretention":
    # DeleteDeadLetters: the oldest expired dead letters of the feed by
    # the (feed, failed_at) index, then a delete of those that repeats the
    # filter.
    r = server.receives(OpMsg("find", "ferry_dead_letters"), timeout=30)
    report("find", {"filter": r.doc.get("filter"), "sort": r.doc.get("sort"), "limit": r.doc.get("limit")})
    r.ok(cursor={"id": Int64(0), "ns": "app.ferry_dead_letters", "firstBatch": [
        {"_id": {"feed": "default/0", "event": "e1"}}, {"_id": {"feed": "default/0", "event": "e2"}}]})
    r = server.receives(OpMsg("delete", "ferry_dead_letters"), timeout=30)
    report("delete", {"deletes": r.doc.get("deletes")})
    r.ok(n=2)

if scenario == "prunekeys":
    # PruneKeys over a chunk of three keys: a and b idle for two days, c
    # appended just now; b still has an event in the outbox. Only a goes,
    # if its sequence is still 4.
    now = datetime.datetime.now(datetime.timezone.utc)
    r = server.receives(OpMsg("find", "ferry_keys"), timeout=30)
    report("find", {"filter": r.doc.get("filter"), "sort": r.doc.get("sort"), "limit": r.doc.get("limit")})
    r.ok(cursor={"id": Int64(0), "ns": "app.ferry_keys", "firstBatch": [
        {"_id": "a", "seq": Int64(4), "touched_at": now - datetime.timedelta(days=2)},
        {"_id": "b", "seq": Int64(9), "touched_at": now - datetime.timedelta(days=2)},
        {"_id": "c", "seq": Int64(1), "touched_at": now}]})
    r = server.receives(OpMsg("distinct", "ferry_outbox"), timeout=30)
    report("distinct", {"key": r.doc.get("key"), "query": r.doc.get("query")})
    r.ok(values=["b"])
    r = server.receives(OpMsg("delete", "ferry_keys"), timeout=30)
    report("delete", {"deletes": r.doc.get("deletes"), "ordered": r.doc.get("ordered")})
    r.ok(n=1)

if scenario == "redrive":
    # RedriveDeadLetters, in one transaction: the dead letter named (feed
    # and event), the feed's parked positions, the event parked for its
    # key in that feed, marked redriven, the dead letter deleted, the
    # commit. Nothing is appended to the outbox.
    eid = "01a22951-45fe-71e0-943a-d0986a3e5969"
    created = datetime.datetime(2026, 1, 2, 3, 4, 5)
    r = server.receives(OpMsg("find", "ferry_dead_letters"), timeout=30)
    report("find", {"filter": r.doc.get("filter"), "sort": r.doc.get("sort"), "limit": r.doc.get("limit"),
                    "startTransaction": r.doc.get("startTransaction")})
    r.ok(cursor={"id": Int64(0), "ns": "app.ferry_dead_letters", "firstBatch": [
        {"_id": {"feed": "hooks/0", "event": eid}, "feed": "hooks/0", "reason": "unroutable", "failed_at": created,
         "event": {"_id": eid, "p": 0, "topic": "orders", "key": "k", "seq": Int64(5), "type": "T", "payload": Binary(b"x"),
                   "created_at": created}}]})
    r = server.receives(OpMsg("findAndModify", "ferry_counters"), timeout=30)
    report("findAndModify", {"query": r.doc.get("query"), "update": r.doc.get("update")})
    r.ok(value={"_id": "parked:hooks/0", "n": Int64(7)}, lastErrorObject={"n": 1, "updatedExisting": True})
    r = server.receives(OpMsg("update", "ferry_parked"), timeout=30)
    report("update", {"updates": r.doc.get("updates")})
    r.ok(n=1, nModified=0, upserted=[{"index": 0, "_id": {"feed": "hooks/0", "event": eid}}])
    r = server.receives(OpMsg("delete", "ferry_dead_letters"), timeout=30)
    report("delete", {"deletes": r.doc.get("deletes")})
    r.ok(n=1)
    r = server.receives(OpMsg("commitTransaction"), timeout=30)
    report("commit", {})
    r.ok()

if scenario == "feeds":
    # ListFeeds: the distinct names of four collections, by index, merged.
    # Then the heads of the keys with redriven events of feed hooks/0:
    # their distinct keys through the partial index, a head per key.
    for coll, names in (("ferry_checkpoints", ["default/0", "chain/eth"]), ("ferry_leases", ["default/0", "members/default/r1"]),
                        ("ferry_dead_letters", ["hooks/0"]), ("ferry_parked", ["hooks/0", "hooks/1"])):
        r = server.receives(OpMsg("distinct", coll), timeout=30)
        report("distinct", {"coll": coll, "key": r.doc.get("key"), "query": r.doc.get("query")})
        r.ok(values=names)
    r = server.receives(OpMsg("distinct", "ferry_parked"), timeout=30)
    report("distinct", {"key": r.doc.get("key"), "query": r.doc.get("query")})
    r.ok(values=["k"])
    r = server.receives(OpMsg("find", "ferry_parked"), timeout=30)
    report("find", {"filter": r.doc.get("filter"), "sort": r.doc.get("sort")})
    created = datetime.datetime(2026, 1, 2, 3, 4, 5)
    r.ok(cursor={"id": Int64(0), "ns": "app.ferry_parked", "firstBatch": [
        {"_id": {"feed": "hooks/0", "event": "01a22951-45fe-71e0-943a-d0986a3e5969"}, "feed": "hooks/0", "key": "k", "pos": Int64(3),
         "parked_at": created, "held": False, "reason": "redriven by an operator after: 410", "redriven": True,
         "event": {"_id": "01a22951-45fe-71e0-943a-d0986a3e5969", "p": 0, "topic": "orders", "key": "k", "seq": Int64(5), "type": "T",
                   "payload": Binary(b"x"), "created_at": created}}]})

if scenario == "migratepartitions":
    # An outbox of Ferry before the count was stored: its relays'
    # checkpoints reach partition 2, its events partition 3. Migrate with
    # no count stores 4 and sets the validator to it.
    empty_database()
    server.autoresponds(lambda r: r.command_name == "listIndexes" and r.ok(
        cursor={"id": Int64(0), "ns": "app.ferry_outbox", "firstBatch": [{"v": 2, "key": {"_id": 1}, "name": "_id_"}]}))
    server.autoresponds(validator_set)
    for coll, p in (("ferry_checkpoints", 2), ("ferry_outbox", 3)):
        server.autoresponds(lambda r, coll=coll, p=p: r.command_name == "find" and r.doc.get("find") == coll and r.ok(
            cursor={"id": Int64(0), "ns": "app." + coll, "firstBatch": [{"_id": "x", "p": p}]}))

    def count_stored(r):
        if r.command_name != "update" or r.doc.get("update") != "ferry_meta":
            return False
        for u in r.doc.get("updates", []):
            if u.get("q", {}).get("_id") == "partitions":
                report("update", u)
                state["n"] = u["u"]["$setOnInsert"]["n"]
        return r.ok(n=1, nModified=0)
    server.autoresponds(count_stored)

if scenario == "partitionguard":
    # The stored count is 4. A producer that follows it inserts with 4; the
    # count has just changed to 8, so the validator refuses the insert;
    # the producer's transaction runs again, with 8.
    inserts = []
    server.autoresponds(lambda r: r.command_name == "findAndModify" and r.ok(value={"_id": r.doc["query"]["_id"], "seq": Int64(1)}))
    server.autoresponds(lambda r: r.command_name in ("commitTransaction", "abortTransaction") and r.ok())

    def outbox_insert(r):
        if r.command_name != "insert" or r.doc.get("insert") != "ferry_outbox":
            return False
        docs = r.doc.get("documents", [])
        inserts.append(docs)
        report("insert", [{"key": d["key"], "p": d["p"], "pc": d.get("pc")} for d in docs])
        if len(inserts) == 1:
            state["n"] = 8
            return r.ok(n=0, writeErrors=[{"index": 0, "code": 121, "errmsg": "Document failed validation"}])
        return r.ok(n=len(docs))
    server.autoresponds(outbox_insert)

if scenario == "setpartitions":
    # A relay holds default/0: the change is refused and the validator
    # restored. Then, with no lease left and nothing in the outbox, the
    # change to 8 stores the count and sets the validator to it.
    server.autoresponds(validator_set)
    server.autoresponds(lambda r: r.command_name == "find" and r.doc.get("find") in ("ferry_checkpoints", "ferry_outbox") and r.ok(
        cursor={"id": Int64(0), "ns": "app." + r.doc["find"], "firstBatch": []}))
    server.autoresponds(lambda r: r.command_name == "aggregate" and r.doc.get("aggregate") == "ferry_outbox" and r.ok(
        cursor={"id": Int64(0), "ns": "app.ferry_outbox", "firstBatch": []}))
    leases = [[{"_id": "default/0", "holder": "relay-1", "term": Int64(3), "expires_at": datetime.datetime(2030, 1, 1)},
               {"_id": "chain/orders", "holder": "chain-1", "term": Int64(1), "expires_at": datetime.datetime(2030, 1, 1)},
               {"_id": "members/default/host-1", "holder": "host-1", "term": Int64(1), "expires_at": datetime.datetime(2030, 1, 1)}]]

    def lease_find(r):
        if r.command_name != "find" or r.doc.get("find") != "ferry_leases":
            return False
        return r.ok(cursor={"id": Int64(0), "ns": "app.ferry_leases", "firstBatch": leases.pop(0) if leases else []})
    server.autoresponds(lease_find)

    def count_changed(r):
        if r.command_name != "update" or r.doc.get("update") != "ferry_meta":
            return False
        for u in r.doc.get("updates", []):
            report("update", u)
            state["n"] = u["u"]["$set"]["n"]
        return r.ok(n=1, nModified=1)
    server.autoresponds(count_changed)

if scenario == "policysweep":
    # SetInboxPolicy with the policy already stored, its sweep left pending
    # after key k0199 (an interrupted change): the policy's document, then
    # a chunk transaction from k0199 on (no keys left), which records the
    # sweep of generation 3 finished, and its commit.
    r = server.receives(OpMsg("findAndModify", "ferry_inbox_groups"), timeout=30)
    report("findAndModify", {"query": r.doc.get("query"), "update": r.doc.get("update"), "upsert": r.doc.get("upsert"), "new": r.doc.get("new")})
    r.ok(value={"_id": "g", "hold_dead": True, "sweeping": True, "sweep_gen": Int64(3), "sweep_after": "k0199"},
         lastErrorObject={"n": 1, "updatedExisting": True})
    r = server.receives(OpMsg("find", "ferry_inbox_keys"), timeout=30)
    report("find", {"filter": r.doc.get("filter"), "sort": r.doc.get("sort"), "limit": r.doc.get("limit"),
                    "startTransaction": r.doc.get("startTransaction")})
    r.ok(cursor={"id": Int64(0), "ns": "app.ferry_inbox_keys", "firstBatch": []})
    r = server.receives(OpMsg("update", "ferry_inbox_groups"), timeout=30)
    report("update", {"updates": r.doc.get("updates")})
    r.ok(n=1, nModified=1)
    r = server.receives(OpMsg("commitTransaction"), timeout=30)
    report("commit", {})
    r.ok()

if scenario == "reaper":
    # ClaimHolders, then ExpireClaims of one worker (three claims).
    r = server.receives(OpMsg("distinct", "ferry_inbox_keys"), timeout=30)
    report("distinct", {"key": r.doc.get("key"), "query": r.doc.get("query")})
    r.ok(values=["w1", "w2"])
    r = server.receives(OpMsg("update", "ferry_inbox_keys"), timeout=30)
    report("update", {"updates": r.doc.get("updates")})
    r.ok(n=3, nModified=3)

sys.stdin.read()  # serve until the test closes our stdin
server.stop()
