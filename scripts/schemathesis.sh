#!/usr/bin/env bash
# Fuzzes the lock server's HTTP API against its own OpenAPI document with schemathesis:
# positive and negative (invalid) inputs, and fails on any server error (5xx), undocumented
# status code, wrong content type, response headers or body that break the document, or a
# dangling $ref in the document.
#
#   scripts/schemathesis.sh [BINARY] [extra schemathesis run options...]
#
# BINARY defaults to target/debug/storage-lock. The server runs over `memory:` on a spare
# loopback port and is stopped when the script exits. Extra options go to `schemathesis run`
# after the script's own (e.g. `--seed 1`, `--max-examples 300`); the run prints its seed, so a
# failing run can be repeated with `--seed N`.
#
# The blocking long-polls (`wait_ms` of GET /v1/locks/{name} and of acquire, up to 30 s each) are
# shortened to at most 100 ms by a hook, or the run would spend most of its time waiting; values
# outside the documented range are sent as generated, so the server's rejection of them is still
# tested.
set -euo pipefail

SCHEMATHESIS_VERSION=4.32.5
EXAMPLES=${SL_SCHEMATHESIS_EXAMPLES:-100} # per operation and phase; about a minute in all
TIME_LIMIT=${SL_SCHEMATHESIS_TIME_LIMIT:-170} # seconds: a hung run fails instead of going on

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/target/debug/storage-lock}
if [ $# -gt 0 ]; then shift; fi
[ -x "$bin" ] || { echo "schemathesis.sh: no executable at $bin (build it first)" >&2; exit 2; }

st_version() { # the version of `schemathesis` (or `st`) on PATH, empty if none
  local cmd
  for cmd in schemathesis st; do
    command -v "$cmd" >/dev/null || continue
    "$cmd" --version 2>/dev/null | sed -n 's/^schemathesis, version \([^ ]*\)$/\1/p' && return 0
  done
}
st_cmd=schemathesis
if [ "$(st_version)" != "$SCHEMATHESIS_VERSION" ]; then
  echo "schemathesis.sh: installing schemathesis==$SCHEMATHESIS_VERSION" >&2
  python3 -m pip install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
  hash -r
  command -v pyenv >/dev/null && pyenv rehash 2>/dev/null || true
fi
if ! command -v schemathesis >/dev/null; then st_cmd=st; fi
[ "$("$st_cmd" --version | sed -n 's/^schemathesis, version //p')" = "$SCHEMATHESIS_VERSION" ] \
  || { echo "schemathesis.sh: $st_cmd is not schemathesis $SCHEMATHESIS_VERSION" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/storage-lock-schemathesis.XXXXXX")
server_pid=
cleanup() {
  local rc=$?
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  if [ "$rc" -eq 0 ]; then
    rm -rf "$work"
  else
    echo "schemathesis.sh: failed (exit $rc); server log and NDJSON report kept in $work" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
"$bin" --storage memory: serve --listen "127.0.0.1:$port" >"$work/server.log" 2>&1 &
server_pid=$!

for _ in $(seq 1 100); do
  curl -fsS "$base/healthz" >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { echo "schemathesis.sh: the server exited:" >&2; cat "$work/server.log" >&2; exit 1; }
  sleep 0.1
done
curl -fsS "$base/healthz" >/dev/null || { echo "schemathesis.sh: $base/healthz does not answer" >&2; exit 1; }

cat >"$work/hooks.py" <<'EOF'
import schemathesis

CAP_MS = 100


def _shorten(v):
    # Only valid waits (0..=30000, as int, integral float or digit string) are shortened.
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and 0 <= v <= 30000:
        return min(v, CAP_MS)
    if isinstance(v, float) and v.is_integer() and 0 <= v <= 30000:
        return float(min(v, CAP_MS))
    if isinstance(v, str) and v.isascii() and v.isdigit() and int(v) <= 30000:
        return str(min(int(v), CAP_MS))
    return v


@schemathesis.hook
def map_case(context, case):
    if isinstance(case.query, dict) and "wait_ms" in case.query:
        v = case.query["wait_ms"]
        case.query["wait_ms"] = [_shorten(x) for x in v] if isinstance(v, list) else _shorten(v)
    if isinstance(case.body, dict) and "wait_ms" in case.body:
        case.body["wait_ms"] = _shorten(case.body["wait_ms"])
    return case
EOF
# A $ref to a schema the document does not define is an error of the document.
cat >"$work/schemathesis.toml" <<'EOF'
[warnings]
fail-on = ["unresolvable_reference"]
EOF

checks=not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance
status=0
(cd "$work" && SCHEMATHESIS_HOOKS="$work/hooks.py" timeout "$TIME_LIMIT" \
  "$st_cmd" --config-file "$work/schemathesis.toml" run "$base/openapi.json" \
  --checks "$checks" \
  --mode all \
  --max-examples "$EXAMPLES" \
  --continue-on-failure \
  --generation-database none \
  --output-sanitize false \
  --report ndjson --report-dir "$work" \
  "$@") || status=$?
# (--output-sanitize false: the default masks any field named like a secret, such as
# expected_fencing_token, which makes the printed reproductions useless; nothing here is secret.)
if [ "$status" -eq 124 ]; then
  echo "schemathesis.sh: schemathesis did not finish within ${TIME_LIMIT}s" >&2
fi
exit "$status"
