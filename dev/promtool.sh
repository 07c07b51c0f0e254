#!/usr/bin/env bash
# Fetches promtool, Prometheus's own rule checker, for the chart's alerting rules
# (tests/deploy/test_prometheus_rules.py: `promtool check rules` and `promtool test rules`), and
# caches it: Debian's `prometheus` package is downloaded (apt-get download: no install, no
# service, no root needed once the package lists know it) and promtool alone taken out of it.
# Cached in $KTHROTTLE_CACHE/promtool-<package version>/promtool. KTHROTTLE_PROMTOOL names a
# binary to use instead. Prints the binary's path on stdout; progress goes to stderr. Exit 1 when
# none can be had.
set -euo pipefail
cache=${KTHROTTLE_CACHE:-$HOME/.cache/kthrottle}
if [ -n "${KTHROTTLE_PROMTOOL:-}" ] && [ -x "$KTHROTTLE_PROMTOOL" ]; then
  echo "$KTHROTTLE_PROMTOOL"
  exit 0
fi
mkdir -p "$cache"
found=$(ls -d "$cache"/promtool-*/promtool 2>/dev/null | head -1 || true)
if [ -n "$found" ] && [ -x "$found" ]; then
  echo "$found"
  exit 0
fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
  || { echo "promtool: needs apt-get and dpkg-deb (Debian) to fetch Debian's prometheus package" >&2; exit 1; }
work=$(mktemp -d "$cache/.promtool-XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download -q prometheus >&2; then
  if [ "$(id -u)" = 0 ]; then
    echo "promtool: refreshing the package lists and trying again" >&2
    apt-get update -q >&2
    apt-get download -q prometheus >&2
  else
    echo "promtool: apt-get download prometheus failed (the package lists may need apt-get update, as root)" >&2
    exit 1
  fi
fi
deb=$(ls prometheus_*.deb)
version=$(dpkg-deb -f "$deb" Version)
dpkg-deb -x "$deb" extracted
"$work/extracted/usr/bin/promtool" --version >&2
dir="$cache/promtool-${version//[^A-Za-z0-9.+-]/_}"
rm -rf "$dir" "$dir.tmp"
mkdir -p "$dir.tmp"
mv extracted/usr/bin/promtool "$dir.tmp/promtool"
mv "$dir.tmp" "$dir"   # appears whole or not at all
echo "$dir/promtool"
