#!/usr/bin/env bash
# Runs every test of the workspace against real servers: unit and integration tests (both suites
# on memory, SQLite, PostgreSQL, MySQL/MariaDB and Redis, the multi-process tests, the
# connection-loss tests, the CLI's end-to-end tests on every backend), doc tests, and a build of
# the benchmarks. scripts/services.sh starts the servers if needed; one that stays unreachable
# fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
cargo test --workspace --all-features --all-targets
cargo test --workspace --all-features --doc
