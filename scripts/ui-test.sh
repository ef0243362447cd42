#!/usr/bin/env bash
# Browser tests of the lock server's web page in headless Chromium (scripts/ui_test.py).
# Installs Debian's chromium and a pinned Playwright for Python if missing; a browser that
# cannot start is a failure. Screenshots go to ${CARGO_TARGET_DIR:-target}/ui-screenshots.
#
#   scripts/ui-test.sh [BINARY]     (default: ${CARGO_TARGET_DIR:-target}/debug/storage-lock)
set -euo pipefail
cd "$(dirname "$0")/.."
PLAYWRIGHT_VERSION=1.49.0
target=${CARGO_TARGET_DIR:-target}
bin=${1:-$target/debug/storage-lock}
[ -x "$bin" ] || { echo "ui-test.sh: no executable at $bin (build it first)" >&2; exit 2; }
if [ ! -x /usr/bin/chromium ]; then
  echo "ui-test.sh: installing Debian's chromium" >&2
  [ -n "${SL_APT_UPDATED:-}" ] || apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if ! python3 -c "import playwright, sys; from importlib.metadata import version; sys.exit(version('playwright') != '$PLAYWRIGHT_VERSION')" 2>/dev/null; then
  echo "ui-test.sh: installing playwright==$PLAYWRIGHT_VERSION (the driver only; the browser is Debian's)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "playwright==$PLAYWRIGHT_VERSION"
fi
exec python3 scripts/ui_test.py "$bin" "$target/ui-screenshots"
