#!/usr/bin/env bash
# Runs every test of the workspace against real servers: unit and integration tests (both suites
# on memory, SQLite, PostgreSQL, MySQL/MariaDB, Redis, Valkey, etcd, NATS JetStream KV, S3 and
# Azure Blob and DynamoDB (emulators), ZooKeeper, memcached; 3-member ZooKeeper ensembles), the multi-process tests, the connection-loss tests, the server-restart tests, the
# CLI's end-to-end tests on every backend, `storage-lock torture` for 20 s on every backend and
# through a lock server, the lock server and its SDK over HTTP and gRPC), doc tests, a build of
# the benchmarks, schemathesis against the server's OpenAPI document, and the browser tests of
# the web page and of torture's reports. scripts/torture.sh is torture's long run.
# scripts/services.sh starts the servers if needed; one that stays unreachable fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
# Every test binary (unit, integration, benchmarks in test mode), built by cargo and run a few at
# a time by scripts/run-tests.py (STORAGE_LOCK_TEST_JOBS of them, 2 by default): what
# `cargo test --workspace --all-features --all-targets` runs, in about half the wall time.
built=$(mktemp)
trap 'rm -f "$built"' EXIT
cargo test --workspace --all-features --all-targets --no-run --message-format json-render-diagnostics >"$built"
python3 scripts/run-tests.py --jobs "${STORAGE_LOCK_TEST_JOBS:-2}" <"$built"
echo "==== doc tests, then schemathesis and the browser tests"
cargo test --workspace --all-features --doc
# The lock server's HTTP API against its own OpenAPI document (installs schemathesis if needed):
# no server error, no undocumented status, no response that breaks the schema.
scripts/schemathesis.sh "${CARGO_TARGET_DIR:-target}/debug/storage-lock"
# The web page in headless Chromium (installs Debian's chromium and Playwright if needed).
scripts/ui-test.sh "${CARGO_TARGET_DIR:-target}/debug/storage-lock"
