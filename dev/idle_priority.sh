#!/usr/bin/env bash
# Runs a command at the lowest CPU and I/O priority this machine offers, as a background job that
# must not disturb what runs beside it (dev/test.sh's compute-only tests beside the broker tests).
# Started in a session of its own (setsid), it sets that session's autogroup to nice 19: with
# autogroup scheduling (Linux's default on desktops and many VMs) CPU is shared between sessions
# first, so a nice value alone would only rank the command within its own session. Then nice 19
# and the idle I/O class for the command itself, where the kernel has them.
set -euo pipefail
if [ -w /proc/self/autogroup ]; then
  echo 19 >/proc/self/autogroup 2>/dev/null || true
fi
if command -v ionice >/dev/null && ionice -c 3 true 2>/dev/null; then
  exec ionice -c 3 nice -n 19 "$@"
fi
exec nice -n 19 "$@"
