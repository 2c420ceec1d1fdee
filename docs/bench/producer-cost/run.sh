#!/usr/bin/env bash
# PostgreSQL CPU and WAL per 10,000 producer transactions of one event,
# for each pgbench script here: Ferry's emit statement (emit.sql, as
# ferrypg's sqlAppendOneNotify, the default: the key's advisory lock, the
# outbox row, the idle relay's wake-up read from the settings row), 0.1's
# (emit-0.1.sql: the key's row in a keys table upserted first, which handed
# out Seq, and the wake-up read from a listeners table), the
# key's row updated before it is inserted, without wake-ups
# (emit-update-first.sql), the outbox insert alone
# (outbox-only.sql), the outbox insert behind a per-key transaction-scoped
# advisory lock and the transaction's xid taken first, as the feed needs, in
# place of the key's row (outbox-advisory.sql: no Seq), and a Watermill-like
# plain insert (plain-insert.sql). stats.sh gives the same statements' figures
# from pg_stat_statements and EXPLAIN (ANALYZE, BUFFERS, WAL).
# Needs a schema "walexp" made by `ferry migrate up --schema walexp` and the
# table made below; run it on the machine PostgreSQL runs on (it reads the
# postmaster's children's CPU from /proc). CPU time, WAL records and bytes
# hold on a busy machine where transactions per second do not.
set -euo pipefail
cd "$(dirname "$0")"
db=${DB:-test}
P="psql -h 127.0.0.1 -U postgres -d $db -Atq"
# 0.1's tables, for emit-0.1.sql and emit-update-first.sql
$P -c 'CREATE TABLE IF NOT EXISTS walexp.keys01 (key text PRIMARY KEY, seq bigint NOT NULL,
  xid xid8 NOT NULL, touched_at timestamptz NOT NULL) WITH (fillfactor = 80)'
$P -c 'CREATE TABLE IF NOT EXISTS walexp.listeners01 (partition integer PRIMARY KEY, until timestamptz NOT NULL)'
$P -c 'CREATE TABLE IF NOT EXISTS walexp.plain ("offset" bigserial PRIMARY KEY, uuid varchar(36) NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(), payload bytea, metadata json, transaction_id xid8 NOT NULL)'
pm=$(pgrep -o -x postgres)
cpu() { awk '{print $14+$15+$16+$17}' /proc/"$pm"/stat; }
for round in 1 2 3; do
	for s in ${SCRIPTS:-emit emit-0.1 emit-update-first outbox-advisory outbox-only plain-insert}; do
		$P -c checkpoint
		$P -c "select pg_stat_reset_shared('wal')" >/dev/null
		before=$(cpu)
		pgbench -h 127.0.0.1 -U postgres -n -M prepared -c 4 -j 2 -t 2500 -f "$s.sql" "$db" >/dev/null 2>&1
		sleep 0.5
		after=$(cpu)
		wal=$($P -c "select wal_records || ' ' || wal_bytes from pg_stat_wal")
		echo "round $round $s: CPU $(( after - before ))0 ms, WAL records bytes $wal (per 10k transactions)"
	done
done
