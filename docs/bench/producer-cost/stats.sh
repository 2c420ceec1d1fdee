#!/usr/bin/env bash
# Per-statement figures for emit.sql (Ferry), emit-0.1.sql (0.1's) and
# plain-insert.sql (Watermill-like): pg_stat_statements' mean execution
# time, shared buffers hit and WAL per call over 2 × 10,000 pgbench
# transactions each, then one warm EXPLAIN (ANALYZE, BUFFERS, WAL) of each.
# Needs a server that loads pg_stat_statements (shared_preload_libraries)
# on PORT (5434 below: a cluster of its own, so the shared one is not
# restarted), with a schema "walexp" made by `ferry migrate up --schema
# walexp`:
#   pg_createcluster 15 stats -p 5434 -- --auth=trust
#   echo "shared_preload_libraries = 'pg_stat_statements'" >> /etc/postgresql/15/stats/postgresql.conf
#   pg_ctlcluster --skip-systemctl-redirect 15 stats start
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
cd "$(dirname "$0")"
port=${PORT:-5434}
db=${DB:-postgres}
P="psql -h 127.0.0.1 -p $port -U postgres -d $db -Atq"
$P -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements'
$P -c 'CREATE TABLE IF NOT EXISTS walexp.keys01 (key text PRIMARY KEY, seq bigint NOT NULL,
  xid xid8 NOT NULL, touched_at timestamptz NOT NULL) WITH (fillfactor = 80)'
$P -c 'CREATE TABLE IF NOT EXISTS walexp.listeners01 (partition integer PRIMARY KEY, until timestamptz NOT NULL)'
$P -c 'CREATE TABLE IF NOT EXISTS walexp.plain ("offset" bigserial PRIMARY KEY, uuid varchar(36) NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(), payload bytea, metadata json, transaction_id xid8 NOT NULL)'
$P -c 'SELECT pg_stat_statements_reset()' >/dev/null
scripts="emit emit-0.1 plain-insert"
for _ in 1 2; do
	for s in $scripts; do
		pgbench -h 127.0.0.1 -p "$port" -U postgres -n -M prepared -c 4 -j 2 -t 2500 -f "$s.sql" "$db" >/dev/null 2>&1
	done
done
echo "calls | µs per call | shared buffers hit | WAL records | WAL bytes | statement"
$P -F ' | ' -c "SELECT calls, round((total_exec_time / calls * 1000)::numeric, 1), round(shared_blks_hit::numeric / calls, 2),
  round(wal_records::numeric / calls, 2), round(wal_bytes::numeric / calls), left(regexp_replace(query, '\s+', ' ', 'g'), 60)
  FROM pg_stat_statements WHERE calls >= 10000 ORDER BY calls DESC, total_exec_time DESC"
for s in $scripts; do
	echo "== EXPLAIN (ANALYZE, BUFFERS, WAL) of $s.sql, key 7, warm"
	{
		for _ in 1 2 3; do
			echo 'BEGIN;'
			grep -v '^\\set' "$s.sql" | sed 's/:k/7/g; 1s/^/EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) /'
			echo 'COMMIT;'
		done
	} | $P | awk 'NR == 1 || /^(Insert|Result)/ { plan = "" } { plan = plan $0 "\n" } END { printf "%s", plan }'
done
