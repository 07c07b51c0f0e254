#!/usr/bin/env bash
# Finds a headless-capable Chromium for the report check (tests/integration/test_report_browser.py)
# and installs Debian's `chromium` package when there is none:
#   apt-get install -y --no-install-recommends chromium   (as root; apt-get update first if the
#   package lists do not know it yet)
# KTHROTTLE_CHROMIUM names a browser to use instead. Prints the browser's path on stdout; progress
# goes to stderr. Exit 1 when none can be had (not root, no apt-get, or the install failed).
set -euo pipefail

found() {
  local candidate
  for candidate in "${KTHROTTLE_CHROMIUM:-}" chromium chromium-browser google-chrome-stable google-chrome; do
    [ -n "$candidate" ] || continue
    if path=$(command -v "$candidate" 2>/dev/null) && [ -x "$path" ]; then
      echo "$path"
      return 0
    fi
  done
  return 1
}

if found; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "chromium: not installed, and installing it needs apt-get as root" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# One install at a time (parallel test runs on one machine); apt-get has its own lock, but
# waiting here gives a second caller the first one's result instead of a lock error.
exec {lock_fd}>/tmp/.kthrottle-chromium.lock
flock "$lock_fd"
if found; then
  exit 0
fi
echo "chromium: installing Debian's chromium package (apt-get, --no-install-recommends)" >&2
if ! apt-get install -y -q --no-install-recommends chromium >&2; then
  echo "chromium: install failed; refreshing the package lists and trying again" >&2
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends chromium >&2
fi
found || { echo "chromium: installed, but no chromium on PATH" >&2; exit 1; }
