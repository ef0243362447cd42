#!/usr/bin/env bash
# The lock server's benchmark (crates/storage-lock-cli/benches/server.rs): starts PostgreSQL and
# a single-node etcd of the project's own (installed with apt if missing) via scripts/services.sh,
# then runs the bench, which prints the tables recorded in BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
sl_etcd
cargo bench -p storage-lock-cli --bench server
