#!/usr/bin/env bash
# Each crate builds with no default features and with each feature alone, so that a user who
# picks one backend (or none) gets a green build. An explicit list: nothing to install.
# Only the etcd backend needs `protoc`: everything else is checked with PROTOC pointing nowhere,
# so a machine without it builds every other crate, the CLI's defaults included.
set -euo pipefail
cd "$(dirname "$0")/.."
check() { # warnings count as failures here too
  echo "== cargo check $*"
  local out
  out=$(cargo check --quiet --message-format short "$@" 2>&1) || { echo "$out"; exit 1; }
  if grep -q "warning" <<<"$out"; then echo "$out"; exit 1; fi
}
export PROTOC=/nonexistent/protoc
check -p storage-lock-core --no-default-features
check -p storage-lock-core --no-default-features --features testing
for f in "" sqlite postgres mysql; do
  check -p storage-lock-sql --no-default-features ${f:+--features "$f"}
done
for f in "" sqlite postgres mysql redis nats memcached dynamodb zookeeper http; do
  check -p storage-lock --no-default-features ${f:+--features "$f"}
done
check -p storage-lock-proto
for f in "" openapi; do
  check -p storage-lock-wire --no-default-features ${f:+--features "$f"}
done
check -p storage-lock-server
for f in "" grpc; do
  check -p storage-lock-client --no-default-features ${f:+--features "$f"}
done
check -p storage-lock-redis
check -p storage-lock-nats
check -p storage-lock-memcached
check -p storage-lock-dynamodb
check -p storage-lock-zookeeper
for f in aws gcp azure; do
  check -p storage-lock-object-store --no-default-features --features "$f"
done
check -p storage-lock --no-default-features --features object-store
check -p storage-lock --no-default-features --features azure
check -p storage-lock-cli
unset PROTOC
check -p storage-lock-etcd
check -p storage-lock --no-default-features --features etcd
check -p storage-lock-cli --features etcd
