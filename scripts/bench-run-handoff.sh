#!/usr/bin/env bash
# `storage-lock run` hand-off on the embedded SQLite default, between two processes: the time
# from the first command's exit to the start of the second's, which waited for the lock.
#
#   scripts/bench-run-handoff.sh [ROUNDS]      (default 40; prints p50 / p90 / max in ms)
#
# Each round: `run` A holds the lock while its command sleeps 0.3 s and then prints the time it
# exits; `run` B starts 0.1 s after A and waits; its command prints the time it starts. Times are
# nanoseconds of the same wall clock (date +%s%N), both taken inside the commands, so the figure
# includes A's release, B's wake-up and acquisition, and the start of B's command (one fork/exec
# of sh), nothing of the harness.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-40}
cargo build -q --release -p storage-lock-cli
bin=${CARGO_TARGET_DIR:-target}/release/storage-lock
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
db="sqlite://$dir/locks.db"
samples=()
for _ in $(seq "$rounds"); do
  "$bin" --storage "$db" run handoff -- sh -c 'sleep 0.3; date +%s%N > "$0"' "$dir/a" &
  a=$!
  sleep 0.1
  "$bin" --storage "$db" run handoff -- sh -c 'date +%s%N > "$0"' "$dir/b"
  wait "$a"
  samples+=($(( $(cat "$dir/b") - $(cat "$dir/a") )))
done
printf '%s\n' "${samples[@]}" | sort -n | awk -v n="$rounds" '
  { v[NR] = $1 }
  END {
    p50 = v[int((n + 1) / 2)]; p90 = v[int(n * 0.9)]; max = v[n]
    printf "storage-lock run hand-off on SQLite, %d rounds: p50 %.2f ms, p90 %.2f ms, max %.2f ms\n",
      n, p50 / 1e6, p90 / 1e6, max / 1e6
  }'
