#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration (both suites on every backend compiled in),
# the multi-process test, doc tests, and a compile check of the benchmarks.
#
# Backends that need a server get it from scripts/services.sh once they land; today every
# backend (memory, SQLite) is embedded, so nothing has to be installed or started.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-features --all-targets
cargo test --workspace --all-features --doc
