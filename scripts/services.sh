#!/usr/bin/env bash
# Starts the servers the backend tests need (PostgreSQL, MariaDB, Redis, etcd) if they are not
# running (installing what is missing: Debian's etcd-server and protobuf-compiler, which
# building the etcd backend needs), creates the test database if missing, and exports the URLs
# the tests read:
#   STORAGE_LOCK_POSTGRES_URL  STORAGE_LOCK_MYSQL_URL  STORAGE_LOCK_REDIS_URL
#   STORAGE_LOCK_ETCD_URL (and STORAGE_LOCK_ETCD_BIN, for the restart test's own etcd)
#   STORAGE_LOCK_TEST_URLS (the CLI's end-to-end tests run against each)
# The machine's Redis (6379) keeps nothing on disk, and the Redis backend refuses a server that
# can forget writes; so the tests get a durable Redis of their own on 6390 (AOF, fsync always).
# Source it (`. scripts/services.sh`). A server that cannot be reached afterwards is an error:
# the caller fails, it never skips.
#
# URLs already set in the environment are used as they are (point them at your own servers).

: "${STORAGE_LOCK_POSTGRES_URL:=postgres://postgres@127.0.0.1:5432/test}"
: "${STORAGE_LOCK_MYSQL_URL:=mysql://root@127.0.0.1:3306/test}"
: "${STORAGE_LOCK_REDIS_URL:=redis://127.0.0.1:6390/}"
export STORAGE_LOCK_POSTGRES_URL STORAGE_LOCK_MYSQL_URL STORAGE_LOCK_REDIS_URL

sl_wait_for() { # name, probe command...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "services.sh: $name is not reachable" >&2
  return 1
}

sl_install() { # debian packages, installed only if their command is missing
  command -v apt-get >/dev/null || { echo "services.sh: cannot install $* (no apt-get)" >&2; return 1; }
  [ -n "${SL_APT_UPDATED:-}" ] || { apt-get update -qq >/dev/null && SL_APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

sl_postgres() {
  pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 && return 0
  command -v pg_ctlcluster >/dev/null || sl_install postgresql postgresql-client || return 1
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  sl_wait_for PostgreSQL pg_isready -h 127.0.0.1 -p 5432 || return 1
}

sl_mariadb() {
  mariadb -h 127.0.0.1 -u root -e 'SELECT 1' >/dev/null 2>&1 && return 0
  command -v mariadbd >/dev/null || sl_install mariadb-server mariadb-client || return 1
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql || true
  sl_wait_for MariaDB mariadb -h 127.0.0.1 -u root -e 'SELECT 1' || return 1
}

sl_redis() {
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && return 0
  command -v redis-server >/dev/null || sl_install redis-server || return 1
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  sl_wait_for Redis redis-cli -h 127.0.0.1 -p 6379 ping || return 1
}

sl_redis_durable() { # the tests' own Redis: append-only file, fsync before every reply
  redis-cli -h 127.0.0.1 -p 6390 ping >/dev/null 2>&1 && return 0
  local dir="${TMPDIR:-/tmp}/storage-lock-redis-6390"
  mkdir -p "$dir"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6390 --save "" --appendonly yes \
    --appendfsync always --dir "$dir" --logfile "$dir/redis.log" || true
  sl_wait_for "Redis (durable, 6390)" redis-cli -h 127.0.0.1 -p 6390 ping || return 1
}

sl_databases() {
  psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -d postgres -c 'CREATE DATABASE test' >/dev/null || return 1
  mariadb -h 127.0.0.1 -u root -e 'CREATE DATABASE IF NOT EXISTS test' || return 1
}

sl_etcd() { # a single-node etcd of the project's own: client 127.0.0.1:2389, peer 127.0.0.1:2390
  : "${STORAGE_LOCK_ETCD_URL:=etcd://127.0.0.1:2389}"
  command -v etcd >/dev/null || sl_install etcd-server || return 1
  STORAGE_LOCK_ETCD_BIN=$(command -v etcd)
  export STORAGE_LOCK_ETCD_URL STORAGE_LOCK_ETCD_BIN
  curl -fsS http://127.0.0.1:2389/health >/dev/null 2>&1 && return 0
  local dir="${TMPDIR:-/tmp}/storage-lock-etcd-2389"
  mkdir -p "$dir"
  setsid etcd --name storage-lock-2389 --data-dir "$dir/data" \
    --listen-client-urls http://127.0.0.1:2389 --advertise-client-urls http://127.0.0.1:2389 \
    --listen-peer-urls http://127.0.0.1:2390 --initial-advertise-peer-urls http://127.0.0.1:2390 \
    --initial-cluster storage-lock-2389=http://127.0.0.1:2390 --initial-cluster-state new \
    </dev/null >>"$dir/etcd.log" 2>&1 &
  disown 2>/dev/null || true
  sl_wait_for "etcd (2389)" curl -fsS http://127.0.0.1:2389/health || return 1
}

sl_protoc() { # build tool: etcd-client compiles etcd's protos with protoc
  command -v protoc >/dev/null || sl_install protobuf-compiler || return 1
}

sl_protoc && sl_postgres && sl_mariadb && sl_redis && sl_redis_durable && sl_databases && sl_etcd \
  || return 1 2>/dev/null || exit 1

export STORAGE_LOCK_TEST_URLS="${STORAGE_LOCK_POSTGRES_URL}?table=storage_lock_cli ${STORAGE_LOCK_MYSQL_URL}?table=storage_lock_cli ${STORAGE_LOCK_REDIS_URL}?prefix=storage-lock-cli:"
