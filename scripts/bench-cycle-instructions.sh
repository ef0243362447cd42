#!/usr/bin/env bash
# Instructions per uncontended acquire + release on the memory engine and on a naive
# Mutex<HashMap> lock table, counted by callgrind (repeatable on a shared machine, unlike
# wall-clock time). Each variant runs N and 2N cycles; the difference / N removes start-up.
# rustix is built on its libc backend (--cfg rustix_use_libc): valgrind cannot follow rustix's
# own vDSO lookup. Usage: scripts/bench-cycle-instructions.sh [N] (default 10000).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10000}
command -v valgrind >/dev/null || { echo "bench-cycle-instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-target}/callgrind
bin=$(RUSTFLAGS="--cfg rustix_use_libc" cargo build -q --profile bench -p storage-lock-core \
  --bench cycle --target-dir "$target" --message-format=json \
  | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
[ -x "$bin" ] || { echo "bench-cycle-instructions.sh: no bench binary built" >&2; exit 1; }
count() { # variant, cycles
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 \
    | sed -n 's/.*I *refs: *//p' | tr -d ,
}
declare -A per
for v in naive engine; do
  a=$(count "$v" "$n"); b=$(count "$v" $((2 * n)))
  per[$v]=$(( (b - a) / n ))
  echo "$v: ${per[$v]} instructions per cycle"
done
awk -v e="${per[engine]}" -v b="${per[naive]}" 'BEGIN { printf "engine / naive: %.2fx\n", e / b }'
