"""A small MongoDB server for ferrymongo's tests where no server exists.

Run by the Go tests with Debian's python3-mockupdb and python3-mongomock:
    /usr/bin/python3 testdata/fakemongo.py
It prints the server's URI on its first line, then serves until stdin
closes. mockupdb speaks the wire protocol to the real Go driver; mongomock
evaluates filters, updates, sorts and aggregation stages. This script adds
what neither has: the replica-set hello, commands as the driver sends them,
pipeline updates, $$NOW, transactions and change streams.

Transactions as MongoDB runs them, in short: a transaction that writes a
document another open transaction wrote, or one committed since it
started, fails with WriteConflict (labelled TransientTransactionError: the
driver runs it again); a write outside one waits for it to end; an abort
undoes its writes, and an idle one ends after a minute. A read sees the
last committed version of another's documents and its own writes (read
committed, where MongoDB reads a snapshot). Change streams report inserts,
updates and deletes, committed, of one collection, through $match stages.
Not here: TTL deletions, indexes other than unique ones, speed (every
query scans its collection).
"""
import copy
import datetime
import sys
import threading
import time
import traceback

import mongomock
import bson
from bson import Int64, Timestamp
from mockupdb import MockupDB
from mongomock import aggregate as mm_aggregate

# mongomock drops a field whose expression compares a missing field
# ({$ne: ["$hold_dead", false]} sets nothing); MongoDB compares missing
# as a value of its own, below null.
_MISSING = object()


def _compare(self, operator, values):
    def value(e):
        try:
            return self.parse(e)
        except KeyError:
            return _MISSING
    a, b = value(values[0]), value(values[1])
    if operator in ("$eq", "$ne"):
        same = (a is _MISSING) == (b is _MISSING) and (a is _MISSING or a == b)
        return same if operator == "$eq" else not same
    if a is _MISSING or b is _MISSING:
        rank = {True: 0, False: 1}
        a, b = rank[a is _MISSING], rank[b is _MISSING]
    if operator == "$cmp":
        return (a > b) - (a < b)
    return mm_aggregate.filtering.bson_compare(mm_aggregate.filtering.SORTING_OPERATOR_MAP[operator], a, b)


mm_aggregate._Parser._handle_comparison_operator = _compare
# MongoDB 5 and later store field names with dots (an event's headers);
# mongomock refuses them as pymongo's older BSON checks did.
mongomock.collection.BSON = None

hello = {"ismaster": True, "isWritablePrimary": True, "minWireVersion": 0, "maxWireVersion": 21,
         "maxBsonObjectSize": 16777216, "maxMessageSizeBytes": 48000000, "maxWriteBatchSize": 100000,
         "logicalSessionTimeoutMinutes": 30, "setName": "rs0", "hosts": ["localhost"], "secondary": False}

store = mongomock.MongoClient()
lock = threading.RLock()
# The server's clock: one tick per committed write, the increment of the
# operation times and change events it reports.
clock = {"tick": 1}
# Open transactions by (session id, txnNumber); which one wrote each
# document, by (database, collection, id); the tick of each document's
# last committed write; the change log (tick, operation, namespace, id);
# open change streams by cursor id.
transactions = {}
owners = {}
committed = {}
changes = []
streams = {}
TX_LIFETIME = 60  # seconds, MongoDB's transactionLifetimeLimitSeconds


class Tx:
    def __init__(self):
        self.start, self.used = clock["tick"], time.monotonic()
        self.writes = {}  # document key -> (collection, id, first image or None)


def optime():
    return Timestamp(1700000000, clock["tick"])


class CommandError(Exception):
    def __init__(self, code, codename, msg, labels=()):
        super().__init__(msg)
        self.code, self.codename, self.labels = code, codename, list(labels)


class Conflict(CommandError):
    def __init__(self, what):
        super().__init__(112, "WriteConflict", "WriteConflict error: another transaction wrote " + what, ["TransientTransactionError"])


def doc_key(coll, i):
    # The id's BSON: the same for a dict and an OrderedDict in one order.
    return (coll.database.name, coll.name, bson.encode({"_id": i}))


def record(writes):
    """Commits writes (document key -> (collection, id, first image)): one
    tick, and a change event for each document that changed."""
    clock["tick"] += 1
    for k, (coll, i, old) in writes.items():
        committed[k] = clock["tick"]
        new = coll.find_one({"_id": i})
        if new == old:
            continue
        op = "insert" if old is None else "delete" if new is None else "update"
        changes.append((clock["tick"], op, k[0], k[1], i))


def end_transaction(key, undo):
    tx = transactions.pop(key, None)
    if tx is None:
        return
    for k in tx.writes:
        if owners.get(k) == key:
            del owners[k]
    if undo:
        for coll, i, old in reversed(list(tx.writes.values())):
            coll.delete_one({"_id": i})
            if old is not None:
                coll.insert_one(old)
    else:
        record(tx.writes)


def expire_transactions():
    for k in [k for k, tx in transactions.items() if time.monotonic() - tx.used > TX_LIFETIME]:
        end_transaction(k, undo=True)


def now():
    t = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def with_now(v, at):
    """v with every "$$NOW" replaced by at."""
    if v == "$$NOW":
        return at
    if isinstance(v, dict):
        return type(v)((k, with_now(x, at)) for k, x in v.items())
    if isinstance(v, list):
        return [with_now(x, at) for x in v]
    return v


def stages(pipeline):
    """The pipeline in the stages mongomock evaluates."""
    out = []
    for stage in with_now(pipeline, now()):
        (op, arg), = stage.items()
        if op == "$unset":
            out.append({"$project": {f: 0 for f in ([arg] if isinstance(arg, str) else arg)}})
        elif op == "$replaceWith":
            out.append({"$replaceRoot": {"newRoot": arg}})
        else:
            out.append({op: arg})
    return out


def sort_spec(sort):
    return [(k, v) for k, v in (sort or {}).items() if k != "$natural"] or None


def equalities(q):
    """The document an upsert starts from: the filter's equality fields."""
    doc = {}
    for k, v in q.items():
        if k == "$and":
            for sub in v:
                doc.update(equalities(sub))
        elif k.startswith("$"):
            continue
        elif isinstance(v, dict) and v and all(x.startswith("$") for x in v):
            if "$eq" in v:
                doc[k] = v["$eq"]
        else:
            doc[k] = v
    return doc


def project(doc, fields):
    if not fields or doc is None:
        return doc
    include = any(v for k, v in fields.items() if k != "_id")
    if include:
        out = {k: doc[k] for k, v in fields.items() if v and k in doc}
        if fields.get("_id", 1) and "_id" in doc:
            out["_id"] = doc["_id"]
        return out
    return {k: v for k, v in doc.items() if fields.get(k, 1)}


class Command:
    def __init__(self, r):
        self.r, self.doc = r, r.doc
        self.db = store[self.doc["$db"]]
        self.tx = self.txkey = None
        self.writes = {}  # this command's, outside a transaction
        if self.doc.get("autocommit") is False:
            self.txkey = (str(self.doc["lsid"]["id"]), int(self.doc["txnNumber"]))
            if self.doc.get("startTransaction"):
                # A new transaction on a session ends its last one.
                for k in [k for k in transactions if k[0] == self.txkey[0] and k != self.txkey]:
                    end_transaction(k, undo=True)
                transactions[self.txkey] = Tx()
            self.tx = transactions.get(self.txkey)
            if self.tx is None and self.r.command_name not in ("commitTransaction", "abortTransaction"):
                raise CommandError(251, "NoSuchTransaction", "Transaction %d has been aborted." % self.txkey[1], ["TransientTransactionError"])
            if self.tx is not None:
                self.tx.used = time.monotonic()

    def _coll(self):
        return self.db[self.doc[self.r.command_name]]

    def _touch(self, coll, ids):
        """Called before a command writes documents ids: fails if another
        open transaction wrote one, or, in a transaction, if one was
        committed after it started (the first committer wins); keeps the
        first image of each."""
        for i in ids:
            k = doc_key(coll, i)
            if owners.get(k, self.txkey) != self.txkey or (self.tx and committed.get(k, 0) > self.tx.start):
                raise Conflict("%s %r" % (coll.name, i))
        writes = self.tx.writes if self.tx else self.writes
        for i in ids:
            k = doc_key(coll, i)
            if k not in writes:
                writes[k] = (coll, i, copy.deepcopy(coll.find_one({"_id": i})))
                if self.tx:
                    owners[k] = self.txkey

    def _theirs(self, coll):
        """The documents of coll that other open transactions wrote."""
        return {k: v for key, tx in transactions.items() if key != self.txkey
                for k, v in tx.writes.items() if k[:2] == (coll.database.name, coll.name)}

    def _read(self, coll, q):
        """The documents of coll that q selects as this command reads them:
        another open transaction's as they were before it wrote them."""
        theirs = self._theirs(coll)
        docs = [d for d in coll.find(q) if doc_key(coll, d["_id"]) not in theirs]
        return docs + [copy.deepcopy(old) for _, _, old in theirs.values() if old is not None and mm_aggregate.filtering.filter_applies(q, old)]

    def _matching(self, coll, q, sort=None, one=False):
        docs = list(coll.find(q, sort=sort_spec(sort)))
        return docs[:1] if one else docs

    def _apply(self, coll, doc, update, inserting):
        """The document after update (operators or a pipeline)."""
        if isinstance(update, list):
            return self._pipeline([copy.deepcopy(doc)], stages(update))[0]
        if not any(k.startswith("$") for k in update):
            return dict(update, _id=doc["_id"])
        scratch = store["fakemongo_scratch"]["docs"]
        scratch.delete_many({})
        if inserting:
            base = {k: v for k, v in doc.items() if k != "_id"}
            scratch.update_one(dict(base, _id=doc["_id"]), with_now(update, now()), upsert=True)
        else:
            scratch.insert_one(copy.deepcopy(doc))
            scratch.update_one({"_id": doc["_id"]}, with_now(update, now()))
        return scratch.find_one({"_id": doc["_id"]})

    def _write_one(self, coll, q, update, upsert, sort=None, multi=False):
        """Updates (or upserts) the documents q selects; returns (matched,
        modified, upserted id, [(before, after)])."""
        olds = self._matching(coll, q, sort, one=not multi)
        self._touch(coll, [d["_id"] for d in olds])
        changes, modified = [], 0
        for old in olds:
            new = self._apply(coll, old, update, False)
            if new != old:
                coll.replace_one({"_id": old["_id"]}, new)
                modified += 1
            changes.append((old, new))
        upserted = None
        if not olds and upsert:
            base = equalities(q)
            base.setdefault("_id", (update.get("_id") if isinstance(update, dict) else None) or mongomock.ObjectId())
            new = self._apply(coll, base, update, True)
            new.setdefault("_id", base["_id"])
            self._touch(coll, [new["_id"]])
            coll.insert_one(new)
            upserted = new["_id"]
            changes.append((None, new))
        return len(olds), modified, upserted, changes

    # Commands, by their names; helpers start with "_".

    def find(self):
        pipeline = []
        if sort_spec(self.doc.get("sort")):
            pipeline.append({"$sort": dict(sort_spec(self.doc.get("sort")))})
        if self.doc.get("skip"):
            pipeline.append({"$skip": self.doc["skip"]})
        if self.doc.get("limit"):
            pipeline.append({"$limit": abs(self.doc["limit"])})
        if self.doc.get("projection"):
            pipeline.append({"$project": self.doc["projection"]})
        return self._cursor(self._pipeline(self._read(self._coll(), self.doc.get("filter") or {}), pipeline))

    def _pipeline(self, docs, pipeline):
        return list(mm_aggregate.process_pipeline(docs, self.db, pipeline, None))

    def _cursor(self, docs):
        return {"cursor": {"id": Int64(0), "ns": self.doc["$db"] + "." + str(self.doc[self.r.command_name]), "firstBatch": docs}}

    def aggregate(self):
        pipeline = self.doc["pipeline"]
        if pipeline and "$changeStream" in pipeline[0]:
            return self._watch(pipeline[0]["$changeStream"], pipeline[1:])
        return self._cursor(self._pipeline(self._read(self._coll(), {}), stages(pipeline)))

    def _watch(self, opts, rest):
        """Opens a change stream: the changes after its start (or from
        startAtOperationTime), through rest, $match stages only."""
        if any(list(st) != ["$match"] for st in rest):
            raise CommandError(40573, "Location40573", "fakemongo's change streams take $match stages only")
        at = opts.get("startAtOperationTime")
        cid = Int64(len(streams) + 1000)
        streams[cid] = {"after": at.inc - 1 if at else clock["tick"], "db": self.doc["$db"], "coll": self.doc["aggregate"],
                        "match": [st["$match"] for st in rest]}
        return {"cursor": {"id": cid, "ns": self.doc["$db"] + "." + self.doc["aggregate"], "firstBatch": [],
                           "postBatchResumeToken": {"_data": "%016x" % streams[cid]["after"]}}}

    def distinct(self):
        values = []
        for d in self._read(self._coll(), self.doc.get("query") or {}):
            v = d.get(self.doc["key"])
            if v is not None and v not in values:
                values.append(v)
        return {"values": values}

    def insert(self):
        coll, n, errors = self._coll(), 0, []
        self._touch(coll, [d["_id"] for d in self.doc.get("documents", [])])
        for i, d in enumerate(self.doc.get("documents", [])):
            try:
                coll.insert_one(d)
                n += 1
            except mongomock.DuplicateKeyError as e:
                errors.append({"index": i, "code": 11000, "errmsg": "E11000 duplicate key error: " + str(e)})
                if self.doc.get("ordered", True):
                    break
        return self._written(n, errors)

    def _written(self, n, errors, **more):
        out = {"n": n, **more}
        if errors:
            out["writeErrors"] = errors
        return out

    def update(self):
        coll, n, modified, upserted, errors = self._coll(), 0, 0, [], []
        for i, u in enumerate(self.doc.get("updates", [])):
            try:
                m, mod, up, _ = self._write_one(coll, u["q"], u["u"], u.get("upsert", False), multi=u.get("multi", False))
            except mongomock.DuplicateKeyError as e:
                errors.append({"index": i, "code": 11000, "errmsg": "E11000 duplicate key error: " + str(e)})
                if self.doc.get("ordered", True):
                    break
                continue
            n, modified = n + m, modified + mod
            if up is not None:
                n += 1
                upserted.append({"index": i, "_id": up})
        more = {"nModified": modified}
        if upserted:
            more["upserted"] = upserted
        return self._written(n, errors, **more)

    def delete(self):
        coll, n = self._coll(), 0
        for d in self.doc.get("deletes", []):
            docs = self._matching(coll, d["q"], one=d.get("limit", 0) == 1)
            self._touch(coll, [x["_id"] for x in docs])
            for x in docs:
                coll.delete_one({"_id": x["_id"]})
            n += len(docs)
        return {"n": n}

    def findAndModify(self):
        coll, q, fields = self._coll(), self.doc.get("query") or {}, self.doc.get("fields")
        if self.doc.get("remove"):
            docs = self._matching(coll, q, self.doc.get("sort"), one=True)
            self._touch(coll, [d["_id"] for d in docs])
            for d in docs:
                coll.delete_one({"_id": d["_id"]})
            return {"value": project(docs[0], fields) if docs else None, "lastErrorObject": {"n": len(docs)}}
        try:
            m, _, up, changes = self._write_one(coll, q, self.doc["update"], self.doc.get("upsert", False), self.doc.get("sort"))
        except mongomock.DuplicateKeyError as e:
            raise CommandError(11000, "DuplicateKey", "E11000 duplicate key error: " + str(e))
        value = None
        if changes:
            old, new = changes[0]
            value = new if self.doc.get("new") else old
        leo = {"n": m + (up is not None), "updatedExisting": m > 0}
        if up is not None:
            leo["upserted"] = up
        return {"value": project(value, fields), "lastErrorObject": leo}

    def create(self):
        if self.doc["create"] in self.db.list_collection_names():
            raise CommandError(48, "NamespaceExists", "Collection already exists. NS: " + self.doc["create"])
        self.db.create_collection(self.doc["create"])
        return {}

    def createIndexes(self):
        coll = self._coll()
        for ix in self.doc["indexes"]:
            opts = {k: ix[k] for k in ("unique", "partialFilterExpression", "expireAfterSeconds", "sparse") if k in ix}
            coll.create_index(list(ix["key"].items()), name=ix["name"], **opts)
        return {"numIndexesBefore": 1, "numIndexesAfter": 1 + len(self.doc["indexes"])}

    def listIndexes(self):
        info = self._coll().index_information()
        docs = [dict({k: v for k, v in i.items() if k != "key"}, v=2, name=name, key=dict(i["key"])) for name, i in info.items()]
        return self._cursor(docs)

    def listCollections(self):
        want = (self.doc.get("filter") or {}).get("name")
        names = [n for n in self.db.list_collection_names() if want in (None, n)]
        return {"cursor": {"id": Int64(0), "ns": self.doc["$db"] + ".$cmd.listCollections",
                           "firstBatch": [{"name": n, "type": "collection", "options": {}, "info": {"readOnly": False}} for n in names]}}

    def collMod(self):
        return {}

    def drop(self):
        self.db.drop_collection(self.doc["drop"])
        return {}

    def dropIndexes(self):
        return {}

    def dropDatabase(self):
        store.drop_database(self.doc["$db"])
        return {}

    def commitTransaction(self):
        end_transaction(self.txkey, undo=False)
        return {}

    def abortTransaction(self):
        end_transaction(self.txkey, undo=True)
        return {}

    def endSessions(self):
        ended = {str(s["id"]) for s in self.doc.get("endSessions", [])}
        for k in [k for k in transactions if k[0] in ended]:
            end_transaction(k, undo=True)
        return {}

    def killCursors(self):
        for c in self.doc.get("cursors", []):
            streams.pop(c, None)
        return {"cursorsKilled": self.doc.get("cursors", []), "cursorsNotFound": [], "cursorsAlive": [], "cursorsUnknown": []}

    def ping(self):
        return {}

    def buildInfo(self):
        return {"version": "7.0.0", "versionArray": [7, 0, 0, 0]}


def pause(seconds):
    """Sleeps, letting mockupdb serve other connections meanwhile: it
    answers every connection's requests under one lock of its own."""
    with server._unlock():
        time.sleep(seconds)


def next_changes(stream):
    """The stream's next change events; moves it past them."""
    out = []
    for tick, op, db, coll, i in changes:
        if tick <= stream["after"] or db != stream["db"] or coll != stream["coll"]:
            continue
        ev = {"_id": {"_data": "%016x" % tick}, "operationType": op, "clusterTime": Timestamp(1700000000, tick),
              "ns": {"db": db, "coll": coll}, "documentKey": {"_id": i}}
        if all(mm_aggregate.filtering.filter_applies(m, ev) for m in stream["match"]):
            out.append(ev)
    stream["after"] = clock["tick"]
    return out


def get_more(r):
    """A change stream's getMore: waits up to maxTimeMS for changes."""
    deadline = time.monotonic() + r.doc.get("maxTimeMS", 1000) / 1000
    while True:
        with lock:
            stream = streams.get(r.doc["getMore"])
            if stream is None:
                return r.command_err(43, "cursor id %d not found" % r.doc["getMore"], codeName="CursorNotFound")
            batch = next_changes(stream)
            if batch or time.monotonic() >= deadline:
                return r.ok(operationTime=optime(), cursor={"id": r.doc["getMore"], "ns": stream["db"] + "." + stream["coll"], "nextBatch": batch,
                                                            "postBatchResumeToken": {"_data": "%016x" % stream["after"]}})
        pause(0.005)


def serve(r):
    name = r.command_name
    if name in ("hello", "ismaster", "isMaster"):
        return r.ok(**hello)
    if name == "getMore":
        return get_more(r)
    fn = getattr(Command, name, None)
    if fn is None or name.startswith("_"):
        print("fakemongo: no command %r: %.2000r" % (name, dict(r.doc)), file=sys.stderr, flush=True)
        return r.command_err(59, "no such command: '%s' (fakemongo)" % name, codeName="CommandNotFound")
    deadline = time.monotonic() + 30
    while True:
        with lock:
            expire_transactions()
            try:
                cmd = Command(r)
                out = fn(cmd)
                if cmd.writes:
                    record(cmd.writes)
                break
            except Conflict as e:
                if r.doc.get("autocommit") is False or time.monotonic() > deadline:
                    return r.command_err(e.code, str(e), codeName=e.codename, errorLabels=e.labels)
            except CommandError as e:
                return r.command_err(e.code, str(e), codeName=e.codename, errorLabels=e.labels)
            except Exception as e:  # a gap in the fake: say so, loudly
                print("fakemongo: %s failed: %r on %.2000r\n%s" % (name, e, dict(r.doc), traceback.format_exc()), file=sys.stderr, flush=True)
                return r.command_err(1, "fakemongo: %s: %r" % (name, e), codeName="InternalError")
        pause(0.002)  # a write outside a transaction waits for it
    return r.ok(operationTime=optime(), **out)


server = MockupDB(auto_ismaster=hello)
server.autoresponds(serve)
server.run()
print(server.uri, flush=True)
sys.stdin.read()
server.stop()
