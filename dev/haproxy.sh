#!/usr/bin/env bash
# Finds an haproxy binary for the load-balancer tests and benchmarks (dev/load_balancer.py:
# several kthrottle replicas behind one TCP load balancer, the PROXY protocol) and installs
# Debian's `haproxy` package when there is none:
#   apt-get install -y --no-install-recommends haproxy   (as root; apt-get update first if the
#   package lists do not know it yet)
# KTHROTTLE_HAPROXY names a binary to use instead. Prints the binary's path on stdout; progress
# goes to stderr. Exit 1 when none can be had (not root, no apt-get, or the install failed).
set -euo pipefail

found() {
  local candidate
  for candidate in "${KTHROTTLE_HAPROXY:-}" haproxy /usr/sbin/haproxy; do
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
  echo "haproxy: not installed, and installing it needs apt-get as root" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# One install at a time (parallel test runs on one machine); apt-get has its own lock, but
# waiting here gives a second caller the first one's result instead of a lock error.
exec {lock_fd}>/tmp/.kthrottle-haproxy.lock
flock "$lock_fd"
if found; then
  exit 0
fi
echo "haproxy: installing Debian's haproxy package (apt-get, --no-install-recommends)" >&2
# The package may start its own service (where init and policy allow): Debian's default
# /etc/haproxy/haproxy.cfg listens on no port, and the tests run their own haproxy processes.
if ! apt-get install -y -q --no-install-recommends haproxy >&2; then
  echo "haproxy: install failed; refreshing the package lists and trying again" >&2
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends haproxy >&2
fi
found || { echo "haproxy: installed, but no haproxy on PATH" >&2; exit 1; }
