#!/usr/bin/env bash
# Gets this machine ready to run the Helm chart's pods with `podman kube play` (the runtime step
# of the test suite, tests/runtime), and prints the environment podman needs here:
#   bash dev/kube.sh            -> prints `CONTAINERS_CONF=<file>` on stdout
# - podman itself: as dev/image.sh finds or installs it (Debian's podman, buildah, runc).
# - catatonit: Debian's package, installed with apt-get (as root) when missing; podman builds the
#   pods' infra ("pause") image from it.
# - A containers.conf for this machine: the runc runtime and ulimits below the hard limits (runc
#   may not raise them in a restricted sandbox), as dev/image.sh --print-run-args gives `podman
#   run`; `podman kube play` takes no such flags, so they go in the file podman reads.
# Exit 1 (with the reason) when podman or catatonit cannot be had.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KTHROTTLE_CACHE:-$HOME/.cache/kthrottle}
say() { echo "kube: $*" >&2; }

run_args=$(bash "$repo/dev/image.sh" --print-run-args) || { say "no container engine"; exit 1; }
engine=${run_args%% *}
if [ "$engine" != podman ]; then
  # docker answered first; the kube step needs podman all the same.
  command -v podman >/dev/null || { say "podman kube play needs podman; only docker is here"; exit 1; }
fi

have_catatonit() {
  command -v catatonit >/dev/null || [ -x /usr/libexec/podman/catatonit ] || [ -x /usr/bin/catatonit ]
}
if ! have_catatonit; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "catatonit is missing, and installing it needs apt-get as root"
    exit 1
  fi
  exec {lock_fd}>/tmp/.kthrottle-catatonit.lock
  flock "$lock_fd"
  if ! have_catatonit; then
    say "installing Debian's catatonit (apt-get): podman builds its pods' pause image from it"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends catatonit >&2 \
      || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends catatonit >&2; }
  fi
  have_catatonit || { say "catatonit could not be installed"; exit 1; }
fi

nofile=$(( $(ulimit -Hn) < 65536 ? $(ulimit -Hn) / 2 : 65536 ))
nproc=$(( $(ulimit -Hu) < 8192 ? $(ulimit -Hu) / 2 : 8192 ))
mkdir -p "$cache"
conf="$cache/containers-kube.conf"
cat > "$conf.partial" <<EOF
# Written by dev/kube.sh for this machine.
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]
[engine]
runtime = "runc"
EOF
mv "$conf.partial" "$conf"
echo "CONTAINERS_CONF=$conf"
