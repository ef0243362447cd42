#!/usr/bin/env bash
# Server-side instructions per acquire + release of PostgreSQL lock statements, counted under
# callgrind (repeatable, unlike wall-clock time on a shared two-core machine).
#
#   scripts/bench-pg-statement-instructions.sh [MODEL.sql ...]   # default: scripts/pg-statements/*.sql
#
# Each model is a pgbench script of one acquisition and one release (the storage's statements
# with literal parameters; before.sql / after.sql are PostgresStorage's before and after the
# sixth session's change, durable-row.sql the bench's baseline). A private server (its own
# initdb in a temporary directory, port ${PG_PORT:-5499}, synchronous_commit off, autovacuum
# off) runs under `valgrind --tool=callgrind --trace-children=yes`; every pgbench run is one
# backend, and per cycle = (instructions at 300 cycles - at 100) / 200. The server is stopped by
# its PID at the end. Needs: PostgreSQL's server binaries, pgbench, valgrind; run as root (the
# server runs as user postgres) or as a user that may run initdb.
set -euo pipefail
cd "$(dirname "$0")/.."
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(scripts/pg-statements/before.sql scripts/pg-statements/after.sql scripts/pg-statements/durable-row.sql)
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
port=${PG_PORT:-5499}
work=$(mktemp -d /tmp/pg-instructions.XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -c "$1"; else bash -c "$1"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$work"
chmod a+rx "$work"
as_pg "$pgbin/initdb -D $work/data -A trust >/dev/null"
mkdir -p "$work/cg" && { [ "$(id -u)" = 0 ] && chown postgres "$work/cg" || true; }
as_pg "valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=$work/cg/cg.%p \
  $pgbin/postgres -D $work/data -p $port -k $work -c listen_addresses=127.0.0.1 \
  -c synchronous_commit=off -c autovacuum=off > $work/server.log 2>&1 & echo \$! > $work/pid"
stop() { kill "$(cat "$work/pid")" 2>/dev/null || true; sleep 2; rm -rf "$work"; }
trap stop EXIT
for _ in $(seq 120); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 1; done
psql -q -h 127.0.0.1 -p "$port" -U postgres postgres -f scripts/pg-statements/setup.sql 2>&1 | grep -v NOTICE || true
# The instructions of the backend that served one pgbench run of `$1` with `$2` cycles.
count() {
  local before after f best=0 n
  before=$(ls "$work/cg")
  pgbench -h 127.0.0.1 -p "$port" -U postgres -n -M prepared -c 1 -j 1 -t "$2" -f "$1" postgres >/dev/null
  sleep 1
  after=$(ls "$work/cg")
  for f in $(comm -13 <(echo "$before" | sort) <(echo "$after" | sort)); do
    n=$(grep -h '^summary:\|^totals:' "$work/cg/$f" | head -1 | awk '{print $2}')
    [ "${n:-0}" -gt "$best" ] && best=$n
  done
  echo "$best"
}
for m in "${models[@]}"; do
  a=$(count "$m" 100)
  b=$(count "$m" 300)
  echo "$(basename "$m" .sql): $(( (b - a) / 200 )) instructions per acquire + release"
done
