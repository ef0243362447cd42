#!/usr/bin/env bash
# The long torture run: `storage-lock torture` on every backend of the test suite
# (scripts/services.sh starts them), on the default SQLite file's kind of storage, and through
# a lock server over SQLite, one after another, each for DURATION (default 60s) with every fault
# the storage allows, for each lock kind in KINDS (default "exclusive rw"). A report per run
# (history.jsonl, verdict.json, report.html) goes to ${CARGO_TARGET_DIR:-target}/torture/; a
# table of verdicts ends the output. Exit 1 if any run found a violation.
#
#   scripts/torture.sh [DURATION] [KINDS]       e.g. scripts/torture.sh 5m "exclusive fair rw semaphore:3"
#
# The test suite's short run (crates/storage-lock-cli/tests/torture.rs, 20 s per backend) is in
# scripts/test.sh; this is the one to leave running, or to run while you restart a server.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-60s}
kinds=${2:-exclusive rw}
. scripts/services.sh
target=${CARGO_TARGET_DIR:-target}
# SL_TORTURE_BIN: an already built binary instead of a release build.
bin=${SL_TORTURE_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release -p storage-lock-cli --all-features
  bin=$target/release/storage-lock
fi
out=$target/torture
rm -rf "$out" && mkdir -p "$out"
work=$(mktemp -d)
server_pid=
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$work"' EXIT

# A lock server over SQLite, on a spare port it announces.
"$bin" --storage "sqlite://$work/served.db" serve --listen 127.0.0.1:0 2> "$work/serve.log" &
server_pid=$!
served=
for _ in $(seq 100); do
  served=$(grep -o 'on http://127.0.0.1:[0-9]*' "$work/serve.log" | head -1 | cut -c4- || true)
  [ -n "$served" ] && break
  sleep 0.1
done
[ -n "$served" ] || { echo "torture.sh: the lock server did not start: $(cat "$work/serve.log")" >&2; exit 1; }

urls=("sqlite://$work/torture.db")
read -r -a more <<< "$STORAGE_LOCK_TEST_URLS"
urls+=("${more[@]}" "$served")
failed=0
rows=()
n=0
for kind in $kinds; do
  for url in "${urls[@]}"; do
    n=$((n + 1))
    report="$out/$n"
    echo "torture.sh: [$n] $kind on $url for $duration" >&2
    code=0
    "$bin" torture "$url" --kind "$kind" --duration "$duration" --json -q --report "$report" \
      > "$report.json" || code=$?
    row=$(python3 - "$report.json" "$code" <<'EOF'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
except Exception:
    print(f"| ? | ? | - | - | - | exit {sys.argv[2]} |")
    sys.exit()
faults = ", ".join(f"{k} {n}" for k, n in v["faults"].items()) or "none"
print(f"| `{v['storage']}` | {v['kind']} | {v['grants']} | {faults} | {len(v['violations'])} | {v['verdict']} |")
EOF
)
    rows+=("$row")
    [ "$code" = 0 ] || failed=1
  done
done
echo
echo "| storage | kind | grants | faults | violations | verdict |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "reports: $out/N/report.html (N as listed above, in order)"
exit $failed
