#!/usr/bin/env bash
# Runs one image build command (`docker build ...` or `podman build ...`, the arguments given),
# its output on stderr, and builds once more only when podman hit its memfd-seal race.
#
#   bash dev/engine_build.sh podman build --isolation chroot ... CONTEXT
#
# Debian's podman 4.3 / buildah 1.28 re-enter their chroot isolation through a sealed memfd copy
# of their own binary; now and then the seal fails with EBUSY ("sealing memfd copy: Device or
# resource busy") before the step runs: a race in that tool, not a fault of the build. Only that
# failure is tried again, once, and said; any other failure exits with the build's status.
set -uo pipefail
say() { echo "image build: $*" >&2; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log" >&2
status=$?
if [ "$status" -ne 0 ] && grep -q "sealing memfd copy" "$log"; then
  say "podman's memfd-seal race (sealing memfd copy: EBUSY) stopped the build: building once more"
  "$@" >&2
  status=$?
fi
exit "$status"
